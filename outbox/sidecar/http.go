package sidecar

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/origin"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

const sessionHeader = "Mcp-Session-Id"

// HTTPHandler serves the proxy over Streamable HTTP: each client session
// gets its own session with the upstream (for a command upstream, its own
// process, as stdio servers serve one client each).
//
// The go-sdk's StreamableHTTPHandler needs a go-sdk server; the proxy has
// none, so it keeps the session table itself and lets a
// StreamableServerTransport per session do the protocol. A session is
// bound to the principal that opened it: a request with another bearer
// token gets 403, as the go-sdk does for its own sessions.
//
// Sessions are bounded (bounds.go): one idle for Options.SessionIdleTimeout
// ends, with its upstream, and a new one beyond Options.MaxSessions, or
// Options.MaxSessionsPerPrincipal for its principal, is refused. Every
// session ends when ctx ends or at [Proxy.Close].
func (p *Proxy) HTTPHandler(ctx context.Context) http.Handler {
	// The event store gives every SSE event an id, so that a client whose
	// stream broke resumes it with Last-Event-ID (2025-11-25), and keeps
	// the upstream's requests sent to the standalone stream before the
	// client's first GET opens it: without a store the go-sdk drops them.
	// The TypeScript SDK's client opens that GET only after
	// notifications/initialized was accepted, and an upstream's request
	// sent as soon as it is initialized (sampling, elicitation) would be
	// lost in between. A GET without Last-Event-ID replays nothing else
	// (events.go). The store is bounded (the go-sdk's default, 10 MiB for
	// all sessions, oldest purged first), and a session's events go when
	// the session does.
	//
	// One thing of resumption is out of reach: the go-sdk writes a priming
	// event (an id before any message) on a POST's stream only when it
	// knows the protocol version of the request, which it reads from a
	// context value that only its own StreamableHTTPHandler sets. So the
	// proxy primes the initialize's stream alone; a later POST's stream
	// gets its first id with its first message, and a stream that breaks
	// before that cannot be resumed (the call's outcome is still recorded,
	// for the client's retry or call_status).
	h := &httpSessions{p: p, ctx: ctx, sessions: map[string]*httpSession{}, perUser: map[string]int{},
		events: newStandaloneEvents()}
	go h.reap()
	// The Origin rule of mcphttp.NewHandler (the transport spec's), first.
	origin.WarnInvalid(p.logger, p.opts.AllowedOrigins, "sidecar: Options.AllowedOrigins")
	return origin.Check(p.opts.AllowedOrigins, mcphttp.LiftParamsKey(h))
}

type httpSessions struct {
	p      *Proxy
	ctx    context.Context
	events mcp.EventStore

	mu       sync.Mutex
	sessions map[string]*httpSession
	// ending counts the sessions closed but not over yet: their calls
	// settling, or their upstream process still exiting (the go-sdk's
	// CommandTransport closes stdin, then waits up to its
	// TerminateDuration before a signal). They count against the limits
	// until they are over, so that no more processes run than
	// Options.MaxSessions allows.
	ending   int
	mux      *muxClient     // the stateless session's, once started (http_stateless.go)
	perUser  map[string]int // sessions by principal, ending ones included
	refusals refusalLog     // sessions the limits refused, for the log (bounds.go)
}

type httpSession struct {
	t      *mcp.StreamableServerTransport
	user   string
	cancel context.CancelCauseFunc
	s      *session // the proxy's session over t; set under httpSessions.mu once it runs
	act    activity
}

func userOf(r *http.Request) string {
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		return ti.UserID
	}
	return ""
}

func (h *httpSessions) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rebound(r) {
		http.Error(w, fmt.Sprintf("Forbidden: a request to a loopback address must name a loopback host, not %q", r.Host), http.StatusForbidden)
		return
	}
	if h.serveTaskMethod(w, r) {
		return
	}
	id := r.Header.Get(sessionHeader)
	if id == "" && r.Method == http.MethodPost {
		if body, ok := peekBody(r); ok && statelessRequest(r, body) {
			h.serveStateless(w, r, body)
			return
		}
	}
	if id == "" {
		if r.Method != http.MethodPost {
			http.Error(w, "a session starts with a POST of initialize", http.StatusBadRequest)
			return
		}
		s, lim, err := h.open(userOf(r))
		switch {
		case lim != nil:
			h.refusals.refused(h.p.logger, lim.msg, time.Now())
			refuse(w, r, lim)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s.serve(w, r)
		return
	}
	h.mu.Lock()
	s := h.sessions[id]
	h.mu.Unlock()
	if s == nil {
		http.Error(w, "session not found", http.StatusNotFound)
		return
	}
	if s.user != userOf(r) {
		http.Error(w, "session belongs to another principal", http.StatusForbidden)
		return
	}
	if r.Method == http.MethodDelete {
		h.close(id)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	s.serve(w, r)
}

func (s *httpSession) serve(w http.ResponseWriter, r *http.Request) {
	s.act.begin()
	defer s.act.end()
	s.t.ServeHTTP(w, r)
}

// open starts a session: its transport, and a proxy session over it that
// runs until the client deletes it, it is idle too long, or the server
// stops. A limit refuses it with lim.
func (h *httpSessions) open(user string) (_ *httpSession, lim *limitError, _ error) {
	id := rand.Text()
	t := &mcp.StreamableServerTransport{SessionID: id, EventStore: h.events}
	ctx, cancel := context.WithCancelCause(h.ctx)
	s := &httpSession{t: t, user: user, cancel: cancel}
	s.act.last.Store(time.Now().UnixNano())
	h.mu.Lock()
	if lim := h.admit(user); lim != nil {
		h.mu.Unlock()
		cancel(errSessionClosed)
		return nil, lim, nil
	}
	h.sessions[id] = s
	h.perUser[user]++
	h.mu.Unlock()
	conn, err := t.Connect(ctx)
	if err != nil {
		h.close(id)
		h.release(s)
		return nil, nil, err
	}
	go func() {
		started := func(ps *session) {
			h.mu.Lock()
			s.s = ps
			h.mu.Unlock()
		}
		// serve returns once the session's calls are settled and its
		// upstream connection closed, for a command once its process
		// exited: only then is its place free.
		if err := h.p.serve(ctx, conn, &s.act, started); err != nil {
			h.p.logger.Warn("http session ended", "error", err)
		}
		h.close(id)
		h.release(s)
	}()
	return s, nil, nil
}

// close ends session id: requests naming it get 404 from now on, but it
// counts against the limits until release.
func (h *httpSessions) close(id string) {
	h.mu.Lock()
	s := h.sessions[id]
	if s != nil {
		delete(h.sessions, id)
		h.ending++
	}
	h.mu.Unlock()
	if s != nil {
		s.cancel(errSessionClosed)
	}
}

// release frees the place of s, closed and over.
func (h *httpSessions) release(s *httpSession) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ending--
	if h.perUser[s.user]--; h.perUser[s.user] <= 0 {
		delete(h.perUser, s.user)
	}
}

// rebound reports a request that reached a loopback address under a name
// that is not a loopback host: a page of another site whose name now
// resolves to 127.0.0.1 (DNS rebinding), which the spec's security best
// practices tell local servers to refuse. The go-sdk's handler, which
// serve uses, refuses these with 403 by the same rule; the official
// conformance suite's dns-rebinding-protection scenario checks it.
func rebound(r *http.Request) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || local == nil {
		return false
	}
	return isLoopback(local.String()) && !isLoopback(r.Host)
}

// isLoopback reports whether hostport (a host, with or without a port)
// names the loopback interface.
func isLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
