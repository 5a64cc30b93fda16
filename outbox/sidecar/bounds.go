package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// What the proxy holds is bounded: HTTP sessions by number (in all and per
// principal) and by idleness, each with its upstream (for a command, a
// process); a forwarded call's wait for its answer by Options.CallTimeout;
// and Close ends every session, and waits until its calls are settled,
// before the caller closes the database under the layer.

// serving tracks the client sessions of Serve, so that Close can end them
// and wait until their calls are settled.
type serving struct {
	mu      sync.Mutex
	closed  bool
	cancels map[*session]context.CancelFunc
	wg      sync.WaitGroup
	ended   chan struct{} // closed by end: stops the HTTP handlers' reapers
}

// add registers a session; false once the proxy is closed.
func (v *serving) add(s *session, cancel context.CancelFunc) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return false
	}
	if v.cancels == nil {
		v.cancels = map[*session]context.CancelFunc{}
	}
	v.cancels[s] = cancel
	v.wg.Add(1)
	return true
}

func (v *serving) done(s *session) {
	v.mu.Lock()
	delete(v.cancels, s)
	v.mu.Unlock()
	v.wg.Done()
}

// end ends every session and waits until each has settled its calls.
func (v *serving) end() {
	v.mu.Lock()
	if !v.closed {
		close(v.ended)
	}
	v.closed = true
	for _, cancel := range v.cancels {
		// Each answers its session's running calls first: a client that
		// is slow to read must not hold up the others.
		go cancel()
	}
	v.mu.Unlock()
	v.wg.Wait()
}

// errProxyClosed refuses a session that starts after Close.
var errProxyClosed = errors.New("proxy: closed")

// errCallTimeout is the fate of a forwarded call the upstream did not
// answer within Options.CallTimeout.
type errCallTimeout time.Duration

func (e errCallTimeout) Error() string {
	return fmt.Sprintf("the tool server did not answer within the proxy's call timeout of %v "+
		"(mcp-outbox proxy --call-timeout, MCP_OUTBOX_CALL_TIMEOUT)", time.Duration(e))
}

// activity is what keeps an HTTP session from being idle: the HTTP
// requests open on it (a client holding its standalone stream open is
// there) and its running tool calls (whose client may have gone, but whose
// outcome is still to be recorded; CallTimeout bounds them).
type activity struct {
	open atomic.Int64
	last atomic.Int64 // unix nanoseconds of the last begin or end
}

func (a *activity) begin() {
	a.last.Store(time.Now().UnixNano())
	a.open.Add(1)
}

func (a *activity) end() {
	a.last.Store(time.Now().UnixNano())
	a.open.Add(-1)
}

// idleFor reports how long nothing has been open, 0 while something is.
func (a *activity) idleFor(now time.Time) time.Duration {
	if a.open.Load() > 0 {
		return 0
	}
	return now.Sub(time.Unix(0, a.last.Load()))
}

// reap ends the sessions idle for longer than Options.SessionIdleTimeout
// until the handler's ctx ends or the proxy is closed. The clients that never end theirs are the reason: the
// official conformance suite's and the TypeScript SDK's close() leave the
// session open, each with an upstream process of its own.
func (h *httpSessions) reap() {
	idle := h.p.opts.SessionIdleTimeout
	every := min(max(idle/4, 10*time.Millisecond), 30*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.p.serving.ended:
			return
		case now := <-t.C:
			h.refusals.flush(h.p.logger, now)
			var stale []string
			h.mu.Lock()
			for id, s := range h.sessions {
				if s.act.idleFor(now) > idle {
					stale = append(stale, id)
				}
			}
			h.mu.Unlock()
			for _, id := range stale {
				h.p.logger.Info("end idle http session", "idle_timeout", idle)
				h.close(id)
			}
		}
	}
}

// limitError is a session refused by a limit.
type limitError struct {
	status int
	msg    string
}

func (e *limitError) Error() string { return e.msg }

// admit reserves a session for user, or says which limit refuses it. The
// caller holds h.mu.
func (h *httpSessions) admit(user string) *limitError {
	o := h.p.opts
	if n := len(h.sessions) + h.ending; n >= o.MaxSessions {
		ending := ""
		if h.ending > 0 {
			ending = fmt.Sprintf(" (%d of them ending: their tool server has yet to exit)", h.ending)
		}
		return &limitError{http.StatusServiceUnavailable, fmt.Sprintf(
			"too many sessions: the proxy has %d open%s, its limit (mcp-outbox proxy --max-sessions, MCP_OUTBOX_MAX_SESSIONS) is %d. "+
				"End sessions you no longer use (HTTP DELETE with their Mcp-Session-Id); idle ones end after %v (--session-idle-timeout).",
			n, ending, o.MaxSessions, o.SessionIdleTimeout)}
	}
	if n := h.perUser[user]; n >= o.MaxSessionsPerPrincipal {
		return &limitError{http.StatusTooManyRequests, fmt.Sprintf(
			"too many sessions for this principal: it has %d open, the limit per principal (mcp-outbox proxy --max-sessions-per-principal, MCP_OUTBOX_MAX_SESSIONS_PER_PRINCIPAL) is %d. "+
				"End sessions you no longer use (HTTP DELETE with their Mcp-Session-Id); idle ones end after %v (--session-idle-timeout).",
			n, o.MaxSessionsPerPrincipal, o.SessionIdleTimeout)}
	}
	return nil
}

// refuse answers a session's initialize with the limit's error: the HTTP
// status says it to any client, and the JSON-RPC error, under the
// request's id, to one that reads the body (the TypeScript SDK puts the
// body in the error it throws, the go-sdk the status).
func refuse(w http.ResponseWriter, r *http.Request, e *limitError) {
	var id jsonrpc.ID
	if body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20)); err == nil {
		if msg, err := jsonrpc.DecodeMessage(body); err == nil {
			if req, ok := msg.(*jsonrpc.Request); ok {
				id = req.ID
			}
		}
	}
	b, err := json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		ID      any    `json:"id"`
		Error   any    `json:"error"`
	}{"2.0", id.Raw(), &jsonrpc.Error{Code: codeSessionLimit, Message: e.msg}})
	if err != nil {
		http.Error(w, e.msg, e.status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	w.Write(b)
}

// codeSessionLimit is the JSON-RPC error of a session refused by a limit:
// in the implementation-defined server error range, as the go-sdk's own
// transport errors are.
const codeSessionLimit = -32000

// refusalEvery is how often, at most, the log says that sessions were
// refused.
const refusalEvery = 10 * time.Second

// refusalLog logs the sessions the limits refuse without a line for each:
// a client that retries at once buries everything else in the log (the
// 1,000-session test's clients made 7,767 lines of it). The first refusal
// is logged as it happens; the next ones are counted, and the count is
// logged, with the latest reason, by the first refusal or reaper tick at
// least refusalEvery after the last line. So a flood makes a line per
// refusalEvery, and its tail is logged within a tick of the reaper. A count
// still pending when the proxy stops is not logged.
type refusalLog struct {
	mu      sync.Mutex
	last    time.Time // when a line was last logged
	pending int       // refusals since then, not yet logged
	reason  string    // the latest of them
}

func (l *refusalLog) refused(logger *slog.Logger, reason string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending++
	l.reason = reason
	l.logDue(logger, now)
}

// flush logs the pending count if a line is due.
func (l *refusalLog) flush(logger *slog.Logger, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending > 0 {
		l.logDue(logger, now)
	}
}

func (l *refusalLog) logDue(logger *slog.Logger, now time.Time) {
	if !l.last.IsZero() && now.Sub(l.last) < refusalEvery {
		return
	}
	logger.Warn("refuse http session", "reason", l.reason, "refused", l.pending)
	l.last, l.pending = now, 0
}
