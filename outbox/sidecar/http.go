package sidecar

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

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
func (p *Proxy) HTTPHandler(ctx context.Context) http.Handler {
	h := &httpSessions{p: p, ctx: ctx, sessions: map[string]*httpSession{}}
	return mcphttp.LiftParamsKey(h)
}

type httpSessions struct {
	p   *Proxy
	ctx context.Context

	mu       sync.Mutex
	sessions map[string]*httpSession
	mux      *muxClient // the stateless session's, once started (http_stateless.go)
}

type httpSession struct {
	t      *mcp.StreamableServerTransport
	user   string
	cancel context.CancelFunc
	s      *session // the proxy's session over t; set under httpSessions.mu once it runs
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
		s, err := h.open(userOf(r))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s.t.ServeHTTP(w, r)
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
	s.t.ServeHTTP(w, r)
}

// open starts a session: its transport, and a proxy session over it that
// runs until the client deletes it or the server stops.
func (h *httpSessions) open(user string) (*httpSession, error) {
	id := rand.Text()
	t := &mcp.StreamableServerTransport{SessionID: id}
	conn, err := t.Connect(h.ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(h.ctx)
	s := &httpSession{t: t, user: user, cancel: cancel}
	h.mu.Lock()
	h.sessions[id] = s
	h.mu.Unlock()
	go func() {
		started := func(ps *session) {
			h.mu.Lock()
			s.s = ps
			h.mu.Unlock()
		}
		if err := h.p.serve(ctx, conn, started); err != nil {
			h.p.logger.Warn("http session ended", "error", err)
		}
		h.close(id)
	}()
	return s, nil
}

func (h *httpSessions) close(id string) {
	h.mu.Lock()
	s := h.sessions[id]
	delete(h.sessions, id)
	h.mu.Unlock()
	if s != nil {
		s.cancel()
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
