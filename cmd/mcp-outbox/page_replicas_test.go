package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// roundRobin is a reverse proxy on 127.0.0.1 that sends each request to
// the next of its backends in turn, as a load balancer without sticky
// sessions does, and records which backend answered what.
type roundRobin struct {
	url      string
	backends []*httputil.ReverseProxy

	mu   sync.Mutex
	next int
	hops []hop
}

// hop is one request through the proxy.
type hop struct {
	method, path string
	backend      int
	status       int
}

func startRoundRobin(t *testing.T, targets ...string) *roundRobin {
	t.Helper()
	rr := &roundRobin{}
	for _, target := range targets {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		// NewSingleHostReverseProxy keeps the browser's Host header, so
		// that the page's same-origin check sees the proxy's address, as
		// it does behind a real balancer.
		rr.backends = append(rr.backends, httputil.NewSingleHostReverseProxy(u))
	}
	srv := httptest.NewServer(http.HandlerFunc(rr.serve))
	t.Cleanup(srv.Close)
	rr.url = srv.URL
	return rr
}

func (rr *roundRobin) serve(w http.ResponseWriter, r *http.Request) {
	// The browser asks for a favicon on its own schedule; answering it
	// here keeps the turns of the page's requests predictable.
	if r.URL.Path == "/favicon.ico" {
		http.NotFound(w, r)
		return
	}
	rr.mu.Lock()
	i := rr.next
	rr.next = (rr.next + 1) % len(rr.backends)
	n := len(rr.hops)
	rr.hops = append(rr.hops, hop{method: r.Method, path: r.URL.Path, backend: i})
	rr.mu.Unlock()
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	rr.backends[i].ServeHTTP(sw, r)
	rr.mu.Lock()
	rr.hops[n].status = sw.status
	rr.mu.Unlock()
}

// after returns the first request after the last one matching method and
// path, and that one.
func (rr *roundRobin) after(t *testing.T, method, path string) (req, next hop) {
	t.Helper()
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for i := len(rr.hops) - 1; i >= 0; i-- {
		if rr.hops[i].method == method && rr.hops[i].path == path {
			if i+1 == len(rr.hops) {
				t.Fatalf("no request after %s %s: %+v", method, path, rr.hops)
			}
			return rr.hops[i], rr.hops[i+1]
		}
	}
	t.Fatalf("no %s %s through the proxy: %+v", method, path, rr.hops)
	return hop{}, hop{}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// TestOperatorPageBrowserReplicas: two `serve --http` replicas on one
// PostgreSQL database, the operator surface under /ops/, behind a
// round-robin proxy, in a real browser, with no session key configured.
// A login through one replica holds on the other, which serves the very
// next request; a flash message set by one shows on the other; a logout
// through either ends the session on both.
func TestOperatorPageBrowserReplicas(t *testing.T) {
	requireBrowser(t)
	dbURL, db := replicaDB(t)
	adminToken, _ := newTokenFor(t, "admin")
	args := []string{"--admin-token-sha256", sha256Hex(adminToken), "--operator-path", "/ops/"}
	aURL, _ := startHTTP(t, bin, dbURL, nil, args...)
	bURL, _ := startHTTP(t, bin, dbURL, nil, args...)
	rr := startRoundRobin(t, strings.TrimSuffix(aURL, "/mcp"), strings.TrimSuffix(bURL, "/mcp"))
	base := rr.url + "/ops/"

	// A dead effect for a destination neither replica is configured for:
	// retried, it becomes pending there, which both must then report.
	now := time.Now().UnixMilli()
	var dead int64
	if err := db.QueryRow(`INSERT INTO effects (seq, destination, method, path, idempotency_key, state, last_error, next_attempt_at, created_at, updated_at)
		VALUES (1, 'payments', 'POST', '/v1/charges', 'browser-replicas-1', 'dead', 'refused: 400', $1, $1, $1) RETURNING id`, now).Scan(&dead); err != nil {
		t.Fatal(err)
	}

	ctx := newBrowser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(base)); err != nil {
		t.Fatalf("open the page: %v", err)
	}
	if loc := browserLocation(t, ctx); loc != base+"login" {
		t.Fatalf("the page without login is at %s, want %slogin", loc, base)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("token"), adminToken)); err != nil {
		t.Fatal(err)
	}
	clickAndLoad(t, ctx, `form.login button`)
	if loc := browserLocation(t, ctx); loc != base {
		t.Fatalf("after login the browser is at %s, want %s", loc, base)
	}
	login, next := rr.after(t, http.MethodPost, "/ops/login")
	if login.status != http.StatusSeeOther || next.method != http.MethodGet || next.path != "/ops/" ||
		next.backend == login.backend || next.status != http.StatusOK {
		t.Fatalf("login through replica %d (%d), then %s %s through replica %d (%d): want the page, logged in, from the other replica",
			login.backend, login.status, next.method, next.path, next.backend, next.status)
	}
	if !browserHas(t, ctx, `form[action="/ops/logout"]`) || !browserHas(t, ctx, fmt.Sprintf("#effect-%d", dead)) {
		t.Fatal("the page after login lacks the logout button or the dead effect")
	}

	clickAndLoad(t, ctx, fmt.Sprintf(`#effect-%d form[action="/ops/effects/%d/retry"] button`, dead, dead))
	action, shown := rr.after(t, http.MethodPost, fmt.Sprintf("/ops/effects/%d/retry", dead))
	if action.status != http.StatusSeeOther || shown.path != "/ops/" || shown.backend == action.backend || shown.status != http.StatusOK {
		t.Errorf("retry through replica %d (%d), then %s through replica %d (%d): want the page from the other replica",
			action.backend, action.status, shown.path, shown.backend, shown.status)
	}
	if msg := browserText(t, ctx, ".flash.done"); !strings.Contains(msg, fmt.Sprintf("Effect %d", dead)) || !strings.Contains(msg, "dead, now pending") {
		t.Errorf("the other replica shows the flash %q", msg)
	}
	// Pending for payments, which neither replica delivers to.
	if msg := browserText(t, ctx, "#unconfigured"); !strings.Contains(msg, "payments (1 pending)") {
		t.Errorf("the page does not name payments as unconfigured: %q", msg)
	}

	clickAndLoad(t, ctx, `form[action="/ops/logout"] button`)
	if loc := browserLocation(t, ctx); loc != base+"login" {
		t.Errorf("after logout the browser is at %s", loc)
	}
	for range 2 { // one request per replica
		if err := chromedp.Do(ctx, chromedp.Navigate(base)); err != nil {
			t.Fatal(err)
		}
		if loc := browserLocation(t, ctx); loc != base+"login" {
			t.Errorf("after logout %s is at %s, want the login form", base, loc)
		}
	}
}
