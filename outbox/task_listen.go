package outbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
	"github.com/mcp-outbox/mcp-outbox/internal/tasknote"
)

// The 2026-07-28 extension's status notifications: a client that wants
// them opens subscriptions/listen with notifications.taskIds, and the
// server pushes notifications/tasks (the task as tasks/get shows it, the
// result included once completed) on that stream. @modelcontextprotocol/
// ext-tasks 0.2.2 acts on one: a terminal notification settles the task
// with no further tasks/get. It does not open the listen itself: the
// application does (Client.listen({taskIds: [...]}) of
// @modelcontextprotocol/client 2.x).
//
// go-sdk v1.8.0 answers subscriptions/listen itself: it decodes the filter
// into NotificationSubscriptions, which has no taskIds, acknowledges only
// what it knows, and ends a listen at once when it knows nothing asked of
// it. So the fronts lift taskIds, with the request's id, into _meta
// (paramskey.ListenMetaKey), and the layer serves a listen that asks for
// tasks and nothing else; one that asks for list changes too is left to
// go-sdk, which drops its taskIds. The acknowledgement and the
// notifications are sent as tasknote markers, which the fronts write as
// themselves (go-sdk cannot send either with our fields).
//
// The listen watches the rows, so it reports a task wherever it runs: a
// task that ends in this process wakes it at once (taskChanged), one that
// ends in another process or replica is seen within listenPoll. It ends,
// with the empty result the spec gives a graceful close, once every task
// it watches is terminal (or gone), or when the client closes it. Over
// stateless Streamable HTTP the listen is its own POST, whose SSE response
// carries the notifications; over stdio they share the one stream.

// listenPoll is how often a listen reads the rows of the tasks it watches,
// for ends this process does not see.
const listenPoll = time.Second

// maxListenTasks bounds the tasks one listen watches (each is a read per
// listenPoll); ids past it are left out of the acknowledgement, which
// tells the client so.
const maxListenTasks = 100

// listenLift is what the fronts lifted from a subscriptions/listen.
type listenLift struct {
	ID      any      `json:"id"`
	TaskIDs []string `json:"taskIds"`
}

// takeListen takes the lifted taskIds out of a listen's _meta. ok is false
// when there are none, or when the listen asks for more than tasks: go-sdk
// serves that one.
func takeListen(p *mcp.SubscriptionsListenParams) (lift listenLift, ok bool) {
	raw, found := p.Meta[paramskey.ListenMetaKey]
	if !found {
		return lift, false
	}
	delete(p.Meta, paramskey.ListenMetaKey)
	if n := p.Notifications; n != nil && (n.ToolsListChanged || n.PromptsListChanged || n.ResourcesListChanged || len(n.ResourceSubscriptions) > 0) {
		return lift, false
	}
	b, err := json.Marshal(raw)
	if err != nil || json.Unmarshal(b, &lift) != nil || lift.ID == nil {
		return lift, false
	}
	return lift, true
}

// taskChanged returns a channel closed when a task of this layer next
// ends or is asked to cancel.
func (l *Layer) taskChanged() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.taskTick == nil {
		l.taskTick = make(chan struct{})
	}
	return l.taskTick
}

func (l *Layer) tickTasks() {
	l.mu.Lock()
	if l.taskTick != nil {
		close(l.taskTick)
		l.taskTick = nil
	}
	l.mu.Unlock()
}

// listenTasks serves a subscriptions/listen for tasks of principal who.
// Ids it cannot find for who (unknown, another principal's) are left out
// of the acknowledgement, as the extension's client reads it
// (readAcceptedTaskIdsV2).
func (l *Layer) listenTasks(ctx context.Context, who string, req *mcp.SubscriptionsListenRequest, lift listenLift) (mcp.Result, error) {
	subMeta := func() map[string]any { return map[string]any{mcp.MetaKeySubscriptionID: lift.ID} }
	send := func(method string, params any) error {
		p, err := tasknote.Progress(method, params)
		if err != nil {
			return err
		}
		return req.Session.NotifyProgress(ctx, p)
	}
	pending := map[string]string{} // id -> the status last sent
	accepted := []string{}
	for _, id := range lift.TaskIDs {
		if _, dup := pending[id]; dup || len(pending) == maxListenTasks {
			continue
		}
		if _, err := l.getTask(ctx, who, id, false); err == nil {
			pending[id] = ""
			accepted = append(accepted, id)
		}
	}
	if err := send("notifications/subscriptions/acknowledged", map[string]any{
		"_meta": subMeta(), "notifications": map[string]any{"taskIds": accepted}}); err != nil {
		return nil, err
	}
	for len(pending) > 0 {
		changed := l.taskChanged()
		for id, last := range pending {
			t, err := l.getTask(ctx, who, id, true)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				delete(pending, id) // purged at its ttl
				continue
			}
			if t.Status != last {
				if err := send("notifications/tasks", taskNotification(t, subMeta())); err != nil {
					return nil, err
				}
				pending[id] = t.Status
			}
			if t.Status != taskWorking {
				delete(pending, id)
			}
		}
		if len(pending) == 0 {
			break
		}
		timer := time.NewTimer(listenPoll)
		select {
		case <-ctx.Done():
			timer.Stop()
			return &mcp.SubscriptionsListenResult{Meta: subMeta()}, nil
		case <-changed:
		case <-timer.C:
		}
		timer.Stop()
	}
	return &mcp.SubscriptionsListenResult{Meta: subMeta()}, nil
}

// taskNotification is the params of notifications/tasks: the task as
// tasks/get answers it, without resultType, with the listen's id in _meta.
func taskNotification(t *taskResult, meta map[string]any) map[string]any {
	b, _ := json.Marshal(t)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	delete(m, "resultType")
	m["_meta"] = meta
	return m
}
