package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

const selectOrphanTasks = `
SELECT id, principal, key, key_source, tool, args_hash, owner, lease_until, task_id, coalesce(task_params, ''), task_cancel
FROM calls WHERE state = 'in_flight' AND task_id IS NOT NULL`

type orphanTask struct {
	principal, key, source, tool, argsHash, owner, taskID, params string
	id, leaseUntil, cancel                                        int64
}

// runTaskRecovery takes over the tasks whose owner is gone (its process
// died on this host, or its lease passed) and runs them again from their
// stored params, at once and then every interval until ctx ends. Only
// tasks of tools registered with this layer under the same name and
// tenant are taken: a task whose tool is not here stays for a process that
// has it. An uncommitted attempt left nothing behind, so running the task
// again is safe; the takeover is the same fenced claim a retry makes, so
// two processes never both run it to a commit.
func (l *Layer) runTaskRecovery(ctx context.Context, interval time.Duration) error {
	for {
		if err := l.recoverTasks(ctx); err != nil && ctx.Err() == nil {
			l.logger.WarnContext(ctx, "task recovery scan", "error", err)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func (l *Layer) recoverTasks(ctx context.Context) error {
	rows, err := l.db.Read.QueryContext(ctx, selectOrphanTasks)
	if err != nil {
		return fmt.Errorf("read tasks in flight: %w", err)
	}
	var found []orphanTask
	for rows.Next() {
		var o orphanTask
		if err := rows.Scan(&o.id, &o.principal, &o.key, &o.source, &o.tool, &o.argsHash, &o.owner, &o.leaseUntil,
			&o.taskID, &o.params, &o.cancel); err != nil {
			rows.Close()
			return fmt.Errorf("read tasks in flight: %w", err)
		}
		found = append(found, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read tasks in flight: %w", err)
	}
	for _, o := range found {
		if ctx.Err() != nil {
			return nil
		}
		l.recoverTask(ctx, o)
	}
	return nil
}

func (l *Layer) recoverTask(ctx context.Context, o orphanTask) {
	l.mu.Lock()
	_, running := l.local[localKey{o.principal, o.key}]
	l.mu.Unlock()
	if running {
		return
	}
	if l.liveness(o.owner) == ownerUnknown && o.leaseUntil > l.nowMS() {
		return // a live owner, or one whose lease still holds
	}
	t := l.taskTool(o.principal, o.tool)
	if t == nil {
		l.mu.Lock()
		first := !l.taskOrphans[o.taskID]
		if l.taskOrphans == nil {
			l.taskOrphans = map[string]bool{}
		}
		l.taskOrphans[o.taskID] = true
		l.mu.Unlock()
		if first {
			l.logger.WarnContext(ctx, "task in flight whose owner is gone, for a tool this process does not serve; left for a process that does",
				"tool", o.tool, "principal", principalLabel(o.principal))
		}
		return
	}
	params, err := l.sealer.OpenString(ctx, l.db.Read, callRef(o.id, "task_params", o.principal), o.params)
	if err != nil {
		l.logger.ErrorContext(ctx, "task's stored params cannot be opened; left in flight", "tool", o.tool, "error", err)
		return
	}
	o.params = params
	var p storedParams
	if err := json.Unmarshal([]byte(o.params), &p); err != nil || o.params == "" {
		l.logger.ErrorContext(ctx, "task's stored params unreadable; left in flight", "tool", o.tool, "error", err)
		return
	}
	a := &attempt{layer: l, tool: t, uid: randomUID(), owner: l.newOwner(),
		id:   callIdentity{principal: o.principal, key: o.key, source: callkey.Source(o.source), argsHash: o.argsHash},
		task: &attemptTask{opts: t.tasks, params: o.params, id: o.taskID, recover: true}}
	if res := l.acquire(ctx, a); res != nil {
		return // finished, taken by another process, or gone meanwhile
	}
	l.logger.InfoContext(ctx, "took over a task whose owner is gone; running it again from its stored params",
		"tool", t.name, "call_id", a.uid, "previous_owner", o.owner)
	if o.cancel != 0 {
		// Asked to stop while its owner was gone: end it cancelled.
		via := "tasks/cancel, recorded in the task's row while its owner was gone"
		a.task.cancelVia.Store(&via)
		a.task.cancelled.Store(true)
		a.abandon(ctx)
		l.leave(a)
		return
	}
	l.startTask(ctx, a, p.request())
}

// taskTool finds a tool that can run a task of principal: one registered
// under name on a server of the principal's tenant, with tasks allowed.
func (l *Layer) taskTool(principal, name string) *toolInfo {
	tenant := ""
	if rest, ok := strings.CutPrefix(principal, "tenant:"); ok {
		tenant, _, _ = strings.Cut(rest, "/")
	}
	l.mu.Lock()
	regs := make([]*serverTools, 0, len(l.servers))
	for _, r := range l.servers {
		regs = append(regs, r)
	}
	l.mu.Unlock()
	if tenant == "" {
		if t := l.remoteTaskTool(name); t != nil && t.runStored != nil && t.record {
			return t
		}
	}
	for _, r := range regs {
		if r.tenant != tenant {
			continue
		}
		if t := r.lookup(name); t != nil && t.runStored != nil && t.record {
			return t
		}
	}
	return nil
}

// stopTasks waits for the tasks this layer runs, until ctx ends; then it
// stops the rest, which stay in flight in their rows (nothing of their
// work committed) for the next start or another replica to run again.
func (l *Layer) stopTasks(ctx context.Context) error {
	l.mu.Lock()
	running := len(l.tasks)
	l.mu.Unlock()
	if running > 0 {
		// Said before the wait: a task may run for minutes, and a process
		// that waits for it in silence looks hung.
		deadline, bounded := ctx.Deadline()
		until := "until Stop's context ends"
		if bounded {
			until = "until " + deadline.Format(time.RFC3339)
		}
		l.logger.InfoContext(ctx, "stop: waiting for the tasks in flight to finish; "+
			"those still running then stop, roll back and run again at the next start",
			"running", running, "until", until)
	}
	done := make(chan struct{})
	go func() {
		l.taskRuns.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	for _, a := range l.tasks {
		a.task.shutdown.Store(true)
		a.task.stop(ErrLayerStopped)
	}
	l.mu.Unlock()
	<-done
	return errors.New("stop outbox: tasks in flight were stopped; they run again at the next start")
}
