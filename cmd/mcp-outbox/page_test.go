package main

import (
	"context"
	"crypto/tls"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/operator"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The query parameters of the message an action redirects with.
const (
	flashDone   = "done"
	flashFailed = "failed"
)

// pageServer is serve's router on a database file, behind ac, on a real
// loopback listener.
type pageServer struct {
	url    string
	router http.Handler
	client *http.Client
}

func newPageServer(t *testing.T, path string, ac *authConfig) *pageServer {
	t.Helper()
	db, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := &app{db: db, server: mcp.NewServer(&mcp.Implementation{Name: "page-test", Version: "v0"}, nil), logger: logger, auth: ac}
	return startPageServer(t, testRouter(t, a, logger))
}

// newPageOnlyServer is the operator surface alone on a real loopback
// listener, on the clock now (a test's).
func newPageOnlyServer(t *testing.T, path string, ac *authConfig, now func() time.Time) *pageServer {
	t.Helper()
	db, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h, err := operator.NewHandler(context.Background(), db, &operator.Options{AdminTokenSHA256: ac.adminHash, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return startPageServer(t, h)
}

// testRouter is newRouter, failing t on an error.
func testRouter(t testing.TB, a *app, logger *slog.Logger) http.Handler {
	t.Helper()
	h, err := newRouter(context.Background(), a, logger)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func startPageServer(t *testing.T, router http.Handler) *pageServer {
	t.Helper()
	s := &pageServer{router: router}
	srv := httptest.NewServer(s.router)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	// Redirects are what the tests look at, so none is followed by itself.
	s.client = &http.Client{Transport: tr, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return s
}

type pageResponse struct {
	status int
	header http.Header
	body   string // HTML-unescaped, for matching text
	raw    string
}

// do sends a request; a POST carries form urlencoded and, as a browser's
// form post would, this server's Origin (mods may change that).
func (s *pageServer) do(t *testing.T, method, path string, form url.Values, mods ...func(*http.Request)) *pageResponse {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, s.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", s.url)
	}
	for _, m := range mods {
		m(req)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return &pageResponse{status: resp.StatusCode, header: resp.Header, body: html.UnescapeString(string(b)), raw: string(b)}
}

func (s *pageServer) get(t *testing.T, path string, mods ...func(*http.Request)) *pageResponse {
	t.Helper()
	return s.do(t, http.MethodGet, path, nil, mods...)
}

func (s *pageServer) post(t *testing.T, path string, form url.Values, mods ...func(*http.Request)) *pageResponse {
	t.Helper()
	if form == nil {
		form = url.Values{}
	}
	return s.do(t, http.MethodPost, path, form, mods...)
}

// flashOf checks that r is the redirect back to the page after an action
// and returns its message and whether it says the action was done.
func flashOf(t *testing.T, r *pageResponse) (done bool, msg string) {
	t.Helper()
	loc := r.header.Get("Location")
	if r.status != http.StatusSeeOther || !strings.HasPrefix(loc, "/?") {
		t.Fatalf("status %d, Location %q; want 303 to the page: %s", r.status, loc, r.body)
	}
	u, err := url.Parse(loc)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	switch {
	case q.Get(flashDone) != "":
		return true, q.Get(flashDone)
	case q.Get(flashFailed) != "":
		return false, q.Get(flashFailed)
	}
	t.Fatalf("redirect %q carries no message", loc)
	return false, ""
}

// wantFlashShown follows the redirect r and checks that the page shows its
// message.
func (s *pageServer) wantFlashShown(t *testing.T, r *pageResponse, mods ...func(*http.Request)) string {
	t.Helper()
	_, msg := flashOf(t, r)
	page := s.get(t, r.header.Get("Location"), mods...)
	if page.status != http.StatusOK || !strings.Contains(page.body, msg) {
		t.Errorf("the page after the redirect (%d) does not show %q", page.status, msg)
	}
	return msg
}

func wantContains(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s: no %q in the page", what, w)
		}
	}
}

// TestPageShowsOutbox: the page shows the counts, the dead and unknown
// effects with their buttons, the recent calls without their raw keys, and
// the chart, with headers that keep it from being framed or cached.
func TestPageShowsOutbox(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	// What a destination answers ends up on the page: it must stay text.
	if _, err := db.Exec(`UPDATE effects SET last_error = '<script>alert(1)</script>', path = '/v1/"><img src=x>' WHERE id = 7`); err != nil {
		t.Fatal(err)
	}
	s := newPageServer(t, path, nil)
	r := s.get(t, "/")
	if strings.Contains(r.raw, "<script>") || strings.Contains(r.raw, "<img") || !strings.Contains(r.raw, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("text from a destination is not escaped")
	}
	if r.status != http.StatusOK || r.header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /: %d %q", r.status, r.header.Get("Content-Type"))
	}
	for k, want := range map[string]string{"X-Frame-Options": "DENY", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
		if got := r.header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "script-src") {
		t.Errorf("Content-Security-Policy %q: want no framing and no script", csp)
	}
	for state, n := range map[string]int{"pending": 1, "in flight": 1, "delivered": 1, "dead": 2, "unknown": 1, "cancelled": 1, "effects": 7} {
		wantContains(t, "counts", r.raw, fmt.Sprintf(`<span class="n">%d</span><span class="l">%s</span>`, n, state))
	}
	wantContains(t, "by destination", r.raw, "<li><code>mailer</code>", `<span class="badge s-dead">1 dead</span>`,
		"<li><code>payments</code>", `<span class="badge s-in_flight">1 in flight</span>`)
	// Dead and unknown, most recently stuck first, with the actions of
	// their state.
	wantContains(t, "stuck effects", r.raw, `id="effect-4"`, `id="effect-5"`, `id="effect-7"`,
		`action="/effects/4/retry"`, `action="/effects/4/cancel"`, `action="/effects/5/resolve"`, `name="outcome" value="retry"`,
		`action="/effects/retry-dead"`, "retry all 2 dead", "HTTP 400: the destination refused the request")
	for _, id := range []int{1, 2, 3, 6} {
		if strings.Contains(r.raw, fmt.Sprintf(`id="effect-%d"`, id)) {
			t.Errorf("effect %d (%s) is listed among the dead and unknown", id, allStates[id-1])
		}
	}
	// Seven calls, each named by the logs' hash of its key, never the key.
	for i := 1; i <= 7; i++ {
		wantContains(t, "recent calls", r.raw, operate.KeyHash(callkey.LocalPrincipal, fmt.Sprintf("operate-%d", i)))
	}
	if strings.Contains(r.body, "operate-") {
		t.Error("the page shows a raw idempotency key")
	}
	// setEffect stamped the delivery and the three failures just now.
	wantContains(t, "chart", r.body, `aria-label="last hour, per minute: 1 delivered, 3 failed"`, `class="bar-ok"`, `class="bar-bad"`)
	if r := s.get(t, "/?window=24h"); !strings.Contains(r.body, "last 24 hours, per hour: 1 delivered, 3 failed") {
		t.Error("window=24h: not the 24-hour chart")
	}
	if r := s.get(t, "/static/page.css"); r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/css") {
		t.Errorf("GET /static/page.css: %d %q", r.status, r.header.Get("Content-Type"))
	}
}

// frontend runs the matrix of TestEffectActionStates through the page's
// forms.
func (s *pageServer) frontend() frontend {
	return frontend{"page", func(t *testing.T, _ string, args []string) (bool, string) {
		t.Helper()
		form := url.Values{}
		if len(args) == 3 {
			form.Set("outcome", args[2])
		}
		return flashOf(t, s.post(t, "/effects/"+args[1]+"/"+args[0], form))
	}}
}

// TestPageActionStates: every button does what the command line and the
// API do to an effect in every state, and refuses the rest naming the
// state, changing nothing.
func TestPageActionStates(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 1)
	fe := newPageServer(t, path, nil).frontend()
	for _, ac := range actionOutcomes {
		for _, from := range allStates {
			name := strings.Join(append([]string{ac.args[0], from}, ac.args[2:]...), "/")
			setEffect(t, db, 1, from, "payments")
			before := readEffectRecord(t, db, 1)
			args := slices.Clone(ac.args)
			args[1] = "1"
			done, msg := fe.do(t, path, args)
			after := readEffectRecord(t, db, 1)
			want, applies := ac.to[from]
			switch {
			case applies && !done:
				t.Errorf("%s: refused (%s), want %s", name, msg, want)
			case !applies && done:
				t.Errorf("%s: done (%s), want refused", name, msg)
			case applies && (after.state != want || !strings.Contains(msg, from+", now "+want)):
				t.Errorf("%s: effect is %s, message %q; want %s", name, after.state, msg, want)
			case !applies && after != before:
				t.Errorf("%s: refused but the effect changed: %+v -> %+v", name, before, after)
			case !applies && !strings.Contains(msg, "effect 1 is "+from):
				t.Errorf("%s: refusal %q does not name the state %s", name, msg, from)
			}
		}
	}
}

// TestPageBadInput: a bad id, outcome or form is refused with a message
// that says what was wrong, and nothing changes.
func TestPageBadInput(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	s := newPageServer(t, path, nil)
	snapshot := func() []effectRecord {
		var out []effectRecord
		for id := int64(1); id <= 7; id++ {
			out = append(out, readEffectRecord(t, db, id))
		}
		return out
	}
	before := snapshot()
	outcome := func(v string) url.Values { return url.Values{"outcome": {v}} }
	for _, tc := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/effects/abc/retry", nil, `retry refused: effect id "abc": want a positive integer`},
		{"/effects/0/cancel", nil, `effect id "0": want a positive integer`},
		{"/effects/-4/retry", nil, `effect id "-4": want a positive integer`},
		{"/effects/99999999999999999999/retry", nil, "want a positive integer"},
		{"/effects/999/retry", nil, "effect 999: no such effect"},
		{"/effects/5/resolve", outcome("maybe"), `outcome "maybe": want delivered`},
		{"/effects/5/resolve", nil, `outcome "": want delivered`},
		{"/effects/4/retry", outcome("delivered"), `unexpected form field "outcome"`},
		{"/effects/5/resolve", url.Values{"outcome": {"delivered", "retry"}}, `form field "outcome" given 2 times`},
		{"/effects/4/cancel", url.Values{"x": {strings.Repeat("y", operate.MaxPageForm)}}, "request body too large"},
		{"/effects/retry-dead", url.Values{"all": {"1"}}, `unexpected form field "all"`},
	} {
		r := s.post(t, tc.path, tc.form)
		done, msg := flashOf(t, r)
		if done || !strings.Contains(msg, tc.want) {
			t.Errorf("POST %s %v: done %v, message %q; want refused with %q", tc.path, tc.form, done, msg, tc.want)
		}
		s.wantFlashShown(t, r)
	}
	if r := s.post(t, "/effects/4/explode", nil); r.status != http.StatusNotFound {
		t.Errorf("POST an unknown action: %d, want 404", r.status)
	}
	if r := s.get(t, "/effects/4/retry"); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET an action: %d, want 405", r.status)
	}
	if after := snapshot(); !slices.Equal(before, after) {
		t.Errorf("refused requests changed effects:\n%+v\n%+v", before, after)
	}
	// A message the server did not sign is not shown.
	if r := s.get(t, "/?"+url.Values{flashDone: {"Everything was delivered."}, "sig": {"00"}}.Encode()); strings.Contains(r.body, "Everything was delivered") {
		t.Error("the page shows an unsigned message from its URL")
	}
	// Retry all dead: effects 4 and 7.
	done, msg := flashOf(t, s.post(t, "/effects/retry-dead", nil))
	if !done || !strings.Contains(msg, "Retried 2 dead effects") || stateOf(t, db, 4) != "pending" || stateOf(t, db, 7) != "pending" {
		t.Errorf("retry-dead: %v %q, effects 4 and 7 %s and %s", done, msg, stateOf(t, db, 4), stateOf(t, db, 7))
	}
}

// TestPageCrossOrigin: a form post from another origin is refused with
// 403 and changes nothing, whether the browser says so in Sec-Fetch-Site
// or only in Origin.
func TestPageCrossOrigin(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	s := newPageServer(t, path, nil)
	header := func(k, v string) func(*http.Request) { return func(r *http.Request) { r.Header.Set(k, v) } }
	for _, tc := range []struct {
		name string
		mods []func(*http.Request)
	}{
		{"foreign origin", []func(*http.Request){header("Origin", "http://attacker.example")}},
		{"same host, other port", []func(*http.Request){header("Origin", "http://127.0.0.1:1")}},
		{"null origin", []func(*http.Request){header("Origin", "null")}},
		{"cross-site fetch", []func(*http.Request){header("Sec-Fetch-Site", "cross-site")}},
		{"same-site but another origin", []func(*http.Request){header("Sec-Fetch-Site", "same-site")}},
		{"same-origin fetch, foreign Origin", []func(*http.Request){header("Sec-Fetch-Site", "same-origin"), header("Origin", "http://attacker.example")}},
	} {
		for _, target := range []string{"/effects/4/cancel", "/effects/retry-dead", "/lookup", "/logout", "/calls/1/resolve"} {
			r := s.post(t, target, nil, tc.mods...)
			if r.status != http.StatusForbidden || !strings.Contains(r.body, "cross-origin request refused") {
				t.Errorf("%s, POST %s: %d, want 403 cross-origin refusal", tc.name, target, r.status)
			}
		}
		if st := stateOf(t, db, 4); st != "dead" {
			t.Fatalf("%s: a refused request made effect 4 %s", tc.name, st)
		}
	}
	// A client that is not a browser sends neither header.
	noOrigin := func(r *http.Request) { r.Header.Del("Origin") }
	if done, _ := flashOf(t, s.post(t, "/effects/4/cancel", nil, noOrigin)); !done || stateOf(t, db, 4) != "cancelled" {
		t.Errorf("POST without Origin: done %v, effect 4 %s", done, stateOf(t, db, 4))
	}
}

// TestPageLoopbackOnly: without an admin token the page, like /admin,
// answers only loopback clients addressing it by a loopback name, and
// needs no login.
func TestPageLoopbackOnly(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	s := newPageServer(t, path, nil)
	for _, tc := range []struct {
		name, remote, host string
		status             int
		want               string
	}{
		{"remote client", "192.0.2.7:40000", "127.0.0.1:8080", 403, "192.0.2.7 is not a loopback address"},
		{"rebound name", "127.0.0.1:40000", "attacker.example:8080", 403, `not "attacker.example:8080"`},
		{"localhost", "127.0.0.1:40000", "localhost:8080", 200, ""},
	} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			target := "/"
			if method == http.MethodPost {
				target = "/effects/4/cancel"
			}
			req := httptest.NewRequest(method, target, nil)
			req.RemoteAddr, req.Host = tc.remote, tc.host
			rec := httptest.NewRecorder()
			s.router.ServeHTTP(rec, req)
			body := html.UnescapeString(rec.Body.String())
			switch {
			case tc.status == 200 && method == http.MethodGet && rec.Code != 200:
				t.Errorf("%s GET: %d %s", tc.name, rec.Code, body)
			case tc.status == 200 && method == http.MethodPost && rec.Code != http.StatusSeeOther:
				t.Errorf("%s POST: %d %s", tc.name, rec.Code, body)
			case tc.status != 200 && (rec.Code != tc.status || !strings.Contains(body, tc.want)):
				t.Errorf("%s %s: %d, want %d with %q: %s", tc.name, method, rec.Code, tc.status, tc.want, body)
			}
		}
		if tc.status != 200 && stateOf(t, db, 4) != "dead" {
			t.Fatalf("%s: effect 4 changed", tc.name)
		}
	}
	// There is nothing to log in to.
	if r := s.get(t, "/login"); r.status != http.StatusSeeOther || r.header.Get("Location") != "/" {
		t.Errorf("GET /login without an admin token: %d %q, want 303 to /", r.status, r.header.Get("Location"))
	}
}

// TestPageLogin: with an admin token, the page wants the token in the
// bearer header or a session cookie from /login, from any address; the
// cookie is HttpOnly and SameSite=Strict, and ends at logout.
func TestPageLogin(t *testing.T) {
	t.Parallel()
	adminToken, _ := newTokenFor(t, "admin")
	aliceToken, aliceLine := newTokenFor(t, "alice")
	path, db := newStatesDB(t)
	s := newPageServer(t, path, loadAuth(t, sha256Hex(adminToken), aliceLine))
	authz := func(v string) func(*http.Request) { return func(r *http.Request) { r.Header.Set("Authorization", v) } }

	// Without a token: to the login form, and no action.
	if r := s.get(t, "/"); r.status != http.StatusSeeOther || r.header.Get("Location") != "/login" {
		t.Errorf("GET / without login: %d %q, want 303 to /login", r.status, r.header.Get("Location"))
	}
	{
		// From another address: a wrong token in the header counts against
		// the limit on wrong admin tokens, which the wrong logins below
		// reach.
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "192.0.2.8:40000"
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		rec := httptest.NewRecorder()
		s.router.ServeHTTP(rec, req)
		if rec.Code != http.StatusSeeOther {
			t.Errorf("GET / with an MCP token: %d, want 303 to /login", rec.Code)
		}
	}
	if r := s.post(t, "/effects/4/cancel", nil); r.status != http.StatusUnauthorized || stateOf(t, db, 4) != "dead" {
		t.Errorf("POST cancel without login: %d, effect 4 %s; want 401, dead", r.status, stateOf(t, db, 4))
	}
	if r := s.get(t, "/login"); r.status != http.StatusOK || !strings.Contains(r.raw, `name="token" type="password"`) {
		t.Errorf("GET /login: %d, no password field", r.status)
	}

	// Wrong tokens: the form again, 401, no cookie.
	for _, wrong := range []string{"", "nope", aliceToken, sha256Hex(adminToken)} {
		r := s.post(t, "/login", url.Values{"token": {wrong}})
		if r.status != http.StatusUnauthorized || !strings.Contains(r.body, "That is not the admin token.") || len(r.header.Values("Set-Cookie")) != 0 {
			t.Errorf("login with %q: %d, cookies %q", wrong, r.status, r.header.Values("Set-Cookie"))
		}
	}
	if r := s.post(t, "/login", url.Values{"token": {adminToken}}, func(r *http.Request) { r.Header.Set("Origin", "http://attacker.example") }); r.status != http.StatusForbidden {
		t.Errorf("cross-origin login: %d, want 403", r.status)
	}

	// The right token: a session cookie.
	r := s.post(t, "/login", url.Values{"token": {adminToken}})
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/" {
		t.Fatalf("login: %d %q, want 303 to /", r.status, r.header.Get("Location"))
	}
	cookies := (&http.Response{Header: r.header}).Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login set cookies %q, want one", r.header.Values("Set-Cookie"))
	}
	c := cookies[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.Path != "/" || c.MaxAge != int(operate.PageSessionTTL.Seconds()) ||
		strings.Contains(c.Value, adminToken) || strings.Contains(c.Value, sha256Hex(adminToken)) {
		t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure over plain HTTP, holding no token", c)
	}
	withCookie := func(r *http.Request) { r.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value}) }
	if r := s.get(t, "/", withCookie); r.status != http.StatusOK || !strings.Contains(r.raw, `action="/logout"`) {
		t.Errorf("GET / with the cookie: %d, or no logout button", r.status)
	}
	if r := s.get(t, "/login", withCookie); r.status != http.StatusSeeOther || r.header.Get("Location") != "/" {
		t.Errorf("GET /login when logged in: %d, want 303 to /", r.status)
	}
	if r := s.get(t, "/", authz("Bearer "+adminToken)); r.status != http.StatusOK {
		t.Errorf("GET / with the bearer token: %d", r.status)
	}
	r = s.post(t, "/effects/4/cancel", nil, withCookie)
	if done, msg := flashOf(t, r); !done || stateOf(t, db, 4) != "cancelled" {
		t.Errorf("cancel with the cookie: %v %q, effect 4 %s", done, msg, stateOf(t, db, 4))
	}
	s.wantFlashShown(t, r, withCookie)
	if r := s.post(t, "/effects/7/cancel", nil, withCookie, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }); r.status != http.StatusForbidden {
		t.Errorf("cross-site post with the cookie: %d, want 403", r.status)
	}
	// The cookie is the page's: /admin still wants the header.
	if r := s.get(t, "/admin/summary", withCookie); r.status != http.StatusUnauthorized {
		t.Errorf("GET /admin/summary with the page's cookie: %d, want 401", r.status)
	}
	// From afar, as with the header.
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr, req.Host = "192.0.2.7:40000", "ledger.example:8080"
	withCookie(req)
	rec := httptest.NewRecorder()
	s.router.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("GET / with the cookie from afar: %d", rec.Code)
	}

	// Logout ends the session, not just the cookie.
	r = s.post(t, "/logout", nil, withCookie)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/login" || !strings.Contains(r.header.Get("Set-Cookie"), "Max-Age=0") {
		t.Errorf("logout: %d %q %q", r.status, r.header.Get("Location"), r.header.Get("Set-Cookie"))
	}
	if r := s.get(t, "/", withCookie); r.status != http.StatusSeeOther {
		t.Errorf("GET / with the cookie after logout: %d, want 303 to /login", r.status)
	}

	// Over TLS, or behind a proxy that terminates it, the cookie is Secure.
	for name, mod := range map[string]func(*http.Request){
		"TLS":                      func(r *http.Request) { r.TLS = &tls.ConnectionState{} },
		"X-Forwarded-Proto: https": func(r *http.Request) { r.Header.Set("X-Forwarded-Proto", "https") },
	} {
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {adminToken}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		mod(req)
		rec := httptest.NewRecorder()
		s.router.ServeHTTP(rec, req)
		if cs := rec.Result().Cookies(); rec.Code != http.StatusSeeOther || len(cs) != 1 || !cs[0].Secure {
			t.Errorf("login over %s: %d, cookies %+v; want one Secure cookie", name, rec.Code, cs)
		}
	}
}

// addPageUnknownCall adds an unknown call as addUnknownCall does, with a
// call id like the layer's (addUnknownCall's holds the key, which the
// page shows nowhere) and the time it became unknown (0: not recorded), and
// returns its row id.
func addPageUnknownCall(t *testing.T, db *sql.DB, principal, key string, created, unknownAt int64) int64 {
	t.Helper()
	addUnknownCall(t, db, principal, key, created)
	uid := "call_" + sha256Hex(principal + "\x00" + key)[:24]
	var at any
	if unknownAt != 0 {
		at = unknownAt
	}
	var id int64
	err := db.QueryRow(`UPDATE calls SET uid = ?, completed_at = ? WHERE principal = ? AND key = ? RETURNING id`, uid, at, principal, key).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// callRow is the whole of a call's row but its identity, to compare.
type callRow struct {
	state, owner           string
	leaseUntil, attempts   int64
	result                 sql.NullString
	completed, keptFor     sql.NullInt64 // keptFor: expires_at - completed_at
	createdAt, expiresAtMS int64
}

// settled is the row without the times of its settlement, which differ
// between two calls settled one after the other.
func (c callRow) settled() callRow {
	c.completed.Int64, c.expiresAtMS = 0, 0
	return c
}

func readCallRow(t *testing.T, db *sql.DB, id int64) (callRow, bool) {
	t.Helper()
	var c callRow
	err := db.QueryRow(`SELECT state, owner, lease_until, attempts, result, completed_at, expires_at - completed_at, created_at, expires_at
FROM calls WHERE id = ?`, id).Scan(&c.state, &c.owner, &c.leaseUntil, &c.attempts, &c.result, &c.completed, &c.keptFor, &c.createdAt, &c.expiresAtMS)
	if errors.Is(err, sql.ErrNoRows) {
		return c, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return c, true
}

// TestPageUnknownCalls: the page lists unknown calls newest first, at most
// operate.PageUnknownCalls of them, with the total, each named by its key's
// hash and with a form to settle it; without any it says so.
func TestPageUnknownCalls(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 1) // call operate-1 is completed
	s := newPageServer(t, path, nil)
	r := s.get(t, "/")
	wantContains(t, "no unknown calls", r.body, `<section class="card" id="unknown-calls">`, "None: every forwarded call has its outcome.")
	if strings.Contains(r.raw, `action="/calls/`) {
		t.Error("a settle form without unknown calls")
	}

	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	lost1 := addPageUnknownCall(t, db, "local", "lost-1", base+1000, base+1500)
	lost2 := addPageUnknownCall(t, db, "local", "lost-2", base+2000, 0)
	alice := addPageUnknownCall(t, db, "user:alice", "lost-1", base+3000, base+3500)
	r = s.get(t, "/")
	if r.status != http.StatusOK {
		t.Fatalf("GET /: %d", r.status)
	}
	wantContains(t, "unknown calls", r.raw, `Unknown calls <span class="badge s-unknown">3</span>`,
		operate.KeyHash("local", "lost-1"), operate.KeyHash("local", "lost-2"), operate.KeyHash("user:alice", "lost-1"),
		"call_"+sha256Hex("user:alice\x00lost-1")[:24], "<td>user:alice</td>",
		fmt.Sprintf(`action="/calls/%d/resolve"`, lost1), `name="outcome" required`,
		`<option value="completed">`, `<option value="failed">`, `<option value="rerun">`, `name="note" maxlength="1000"`,
		fmt.Sprintf(`<time datetime="%s"`, time.UnixMilli(base+3500).UTC().Format(time.RFC3339Nano)),
		`title="Its claim was found abandoned; when is not recorded">—</span>`)
	if strings.Contains(r.body, "lost-") {
		t.Error("the page shows a raw idempotency key")
	}
	// Newest first.
	var at []int
	for _, id := range []int64{alice, lost2, lost1} {
		at = append(at, strings.Index(r.raw, fmt.Sprintf(`<tr id="call-%d">`, id)))
	}
	if at[0] < 0 || !slices.IsSorted(at) {
		t.Errorf("rows of calls %d, %d, %d at %v: want all, newest first", alice, lost2, lost1, at)
	}
	if strings.Contains(r.body, "Showing the") && strings.Contains(r.body, "newest of") {
		t.Error("a complete list says it is cut short")
	}
	// The completed call is not among them.
	var done int64
	if err := db.QueryRow(`SELECT id FROM calls WHERE key = 'operate-1'`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(r.raw, fmt.Sprintf(`id="call-%d"`, done)) {
		t.Error("a completed call is listed as unknown")
	}

	// Bounded: the newest operate.PageUnknownCalls, and how many there are.
	for i := range operate.PageUnknownCalls - 2 {
		addPageUnknownCall(t, db, "local", fmt.Sprintf("more-%d", i), base+10000+int64(i), 0)
	}
	r = s.get(t, "/")
	total := operate.PageUnknownCalls + 1
	if n := strings.Count(r.raw, `<tr id="call-`); n != operate.PageUnknownCalls {
		t.Errorf("%d unknown calls listed, want %d", n, operate.PageUnknownCalls)
	}
	wantContains(t, "a long list", r.body, fmt.Sprintf("Showing the %d newest of %d.", operate.PageUnknownCalls, total),
		fmt.Sprintf(`Unknown calls <span class="badge s-unknown">%d</span>`, total))
	if strings.Contains(r.raw, fmt.Sprintf(`id="call-%d"`, lost1)) {
		t.Error("the oldest unknown call is listed beyond the limit")
	}
}

// TestPageResolveCall: settling an unknown call from the page does to its
// row what admin.ResolveCall does, says so, and names the call without
// its key; a settled call cannot be settled again.
func TestPageResolveCall(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 1)
	s := newPageServer(t, path, nil)
	base := time.Now().Add(-time.Hour).UnixMilli()
	settle := func(id int64, outcome, note string) (bool, string) {
		t.Helper()
		r := s.post(t, fmt.Sprintf("/calls/%d/resolve", id), url.Values{"outcome": {outcome}, "note": {note}})
		done, msg := flashOf(t, r)
		s.wantFlashShown(t, r)
		if strings.Contains(r.header.Get("Location"), "lost-") || strings.Contains(msg, "lost-") {
			t.Errorf("the redirect after settling names a raw key: %s", r.header.Get("Location"))
		}
		return done, msg
	}
	// Each call through the page has a twin (another principal, same
	// times) settled by admin.ResolveCall itself.
	direct, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	for i, tc := range []struct{ outcome, note, want string }{
		{string(admin.CallCompleted), "  charge ch_1 is at the processor ", "was unknown, now completed."},
		{string(admin.CallFailed), "", "was unknown, now failed."},
		{string(admin.CallRerun), "", "was unknown, now forgotten: the next retry with its key runs it."},
		{string(admin.CallRerun), "it never arrived", "The note was not recorded"},
	} {
		key := fmt.Sprintf("lost-%d", i)
		id := addPageUnknownCall(t, db, "user:alice", key, base+int64(i), base+int64(i)+500)
		twin := addPageUnknownCall(t, db, "user:twin", key, base+int64(i), base+int64(i)+500)
		done, msg := settle(id, tc.outcome, tc.note)
		wantName := fmt.Sprintf("Call %d (charge of user:alice, key %s): ", id, operate.KeyHash("user:alice", key))
		if !done || !strings.HasPrefix(msg, wantName) || !strings.Contains(msg, tc.want) {
			t.Errorf("settle %s: done %v, %q; want %q...%q", tc.outcome, done, msg, wantName, tc.want)
		}
		if err := admin.ResolveCall(context.Background(), direct, admin.CallRef{Principal: "user:twin", Key: key},
			admin.Resolution{Outcome: admin.CallOutcome(tc.outcome), Note: strings.TrimSpace(tc.note)}); err != nil {
			t.Fatal(err)
		}
		got, gotOK := readCallRow(t, db, id)
		want, wantOK := readCallRow(t, db, twin)
		if gotOK != wantOK || got.settled() != want.settled() {
			t.Errorf("settle %s: row %+v (%v), ResolveCall made %+v (%v)", tc.outcome, got, gotOK, want, wantOK)
		}
		if tc.outcome == string(admin.CallCompleted) {
			if st, res := callStateOf(t, db, "user:alice", key); st != "completed" ||
				res != `{"content":[{"type":"text","text":"[resolved by an operator] charge ch_1 is at the processor"}]}` {
				t.Errorf("settled as completed: %s %s", st, res)
			}
		}
		if tc.outcome == string(admin.CallRerun) && gotOK {
			t.Errorf("settled as rerun, the call is still there: %+v", got)
		}
		if r := s.get(t, "/"); strings.Contains(r.raw, fmt.Sprintf(`id="call-%d"`, id)) {
			t.Errorf("settled call %d is still listed", id)
		}
	}
	// Twice: refused, naming the state, and nothing changes.
	id := addPageUnknownCall(t, db, "local", "lost-twice", base, 0)
	if done, msg := settle(id, string(admin.CallCompleted), "first"); !done {
		t.Fatalf("settle: %s", msg)
	}
	before, _ := readCallRow(t, db, id)
	done, msg := settle(id, string(admin.CallFailed), "second")
	if after, _ := readCallRow(t, db, id); done || after != before ||
		!strings.Contains(msg, fmt.Sprintf("settle refused: Call %d (charge of local, key %s) is completed: only a call in state unknown can be resolved", id, operate.KeyHash("local", "lost-twice"))) {
		t.Errorf("settling twice: done %v, %q; row %+v -> %+v", done, msg, before, after)
	}
}

// TestPageResolveCallRefusals: a bad id, outcome or form, a call that is
// not unknown, a post from another origin or without a login are refused,
// with a message or a 4xx, never a 500, and change no call.
func TestPageResolveCallRefusals(t *testing.T) {
	t.Parallel()
	adminToken, _ := newTokenFor(t, "admin")
	path, db := newEffectsDB(t, 1) // call operate-1 is completed
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	lost := addPageUnknownCall(t, db, "local", "lost-1", base, base+1)
	var done int64
	if err := db.QueryRow(`SELECT id FROM calls WHERE key = 'operate-1'`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	snapshot := func() map[int64]callRow {
		out := map[int64]callRow{}
		for _, id := range []int64{lost, done} {
			out[id], _ = readCallRow(t, db, id)
		}
		return out
	}
	before := snapshot()

	s := newPageServer(t, path, nil)
	target := fmt.Sprintf("/calls/%d/resolve", lost)
	form := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Add(kv[i], kv[i+1])
		}
		return v
	}
	for _, tc := range []struct {
		path string
		form url.Values
		want string
	}{
		{"/calls/abc/resolve", form("outcome", "rerun"), `settle refused: call id "abc": want a positive integer`},
		{"/calls/0/resolve", form("outcome", "rerun"), `call id "0": want a positive integer`},
		{"/calls/99999999999999999999/resolve", form("outcome", "rerun"), "want a positive integer"},
		{"/calls/999/resolve", form("outcome", "rerun"), "call 999: no such call"},
		{target, form("outcome", "maybe"), `outcome "maybe": want completed, failed or rerun`},
		{target, form("outcome", "delivered"), `outcome "delivered": want completed, failed or rerun`},
		{target, nil, `outcome "": want completed`},
		{target, form("outcome", "completed", "outcome", "rerun"), `form field "outcome" given 2 times`},
		{target, form("outcome", "rerun", "key", "lost-1"), `unexpected form field "key"`},
		{target, form("outcome", "completed", "note", strings.Repeat("n", 1001)), "note: 1001 bytes, the limit is 1000"},
		{target, form("outcome", "completed", "note", strings.Repeat("n", operate.MaxPageForm)), "request body too large"},
		{fmt.Sprintf("/calls/%d/resolve", done), form("outcome", "rerun"),
			fmt.Sprintf("Call %d (charge of local, key %s) is completed: only a call in state unknown can be resolved", done, operate.KeyHash("local", "operate-1"))},
	} {
		r := s.post(t, tc.path, tc.form)
		ok, msg := flashOf(t, r)
		if ok || !strings.Contains(msg, tc.want) {
			t.Errorf("POST %s %v: done %v, %q; want refused with %q", tc.path, operate.Shorten(tc.form.Encode(), 80), ok, msg, tc.want)
		}
		if strings.Contains(msg, "operate-1") || strings.Contains(msg, "lost-1") {
			t.Errorf("POST %s: the message names a raw key: %q", tc.path, msg)
		}
		s.wantFlashShown(t, r)
	}
	if r := s.get(t, target); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET %s: %d, want 405", target, r.status)
	}
	// Forged from another origin: 403 before anything is read.
	header := func(k, v string) func(*http.Request) { return func(r *http.Request) { r.Header.Set(k, v) } }
	for _, mod := range []func(*http.Request){
		header("Origin", "http://attacker.example"), header("Origin", "null"), header("Sec-Fetch-Site", "cross-site"),
	} {
		if r := s.post(t, target, form("outcome", "rerun"), mod); r.status != http.StatusForbidden || !strings.Contains(r.body, "cross-origin request refused") {
			t.Errorf("cross-origin settle: %d, want 403", r.status)
		}
	}
	// With an admin token, only after a login.
	locked := newPageServer(t, path, loadAuth(t, sha256Hex(adminToken)))
	if r := locked.post(t, target, form("outcome", "rerun")); r.status != http.StatusUnauthorized {
		t.Errorf("settle without login: %d, want 401", r.status)
	}
	if after := snapshot(); !maps.Equal(before, after) {
		t.Errorf("refused requests changed calls:\n%+v\n%+v", before, after)
	}
	// Still there to settle.
	if ok, msg := flashOf(t, s.post(t, target, form("outcome", "rerun"))); !ok {
		t.Errorf("settle after the refusals: %q", msg)
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestPageLoginRateLimit: after operate.MaxLoginFailures wrong tokens from one
// address within loginWindow, its logins get 429 with Retry-After, the
// token unchecked, until the window ends, but for the admin token once it
// was accepted (behind a reverse proxy the address is every operator's);
// other addresses, and logins that succeed, are not held against it.
func TestPageLoginRateLimit(t *testing.T) {
	t.Parallel()
	adminToken, _ := newTokenFor(t, "admin")
	path, _ := newEffectsDB(t, 1)
	clock := &fakeClock{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	s := newPageOnlyServer(t, path, loadAuth(t, sha256Hex(adminToken)), clock.Now)
	login := func(token string, mods ...func(*http.Request)) *pageResponse {
		t.Helper()
		return s.post(t, "/login", url.Values{"token": {token}}, mods...)
	}
	wantLogin := func(what string, r *pageResponse) {
		t.Helper()
		if r.status != http.StatusSeeOther || len(r.header.Values("Set-Cookie")) != 1 {
			t.Errorf("%s: %d, cookies %q; want 303 with a session", what, r.status, r.header.Values("Set-Cookie"))
		}
	}
	wantRefused := func(what string, r *pageResponse) {
		t.Helper()
		if r.status != http.StatusUnauthorized || !strings.Contains(r.body, "That is not the admin token.") {
			t.Errorf("%s: %d, want 401", what, r.status)
		}
	}
	wantLimited := func(what string, r *pageResponse, retryAfter string) {
		t.Helper()
		if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != retryAfter ||
			!strings.Contains(r.body, "Too many failed logins from this address: wait "+retryAfter+" seconds, then try again.") ||
			len(r.header.Values("Set-Cookie")) != 0 || !strings.Contains(r.raw, `name="token" type="password"`) {
			t.Errorf("%s: %d, Retry-After %q, cookies %q; want 429 with Retry-After %s and the form", what, r.status,
				r.header.Get("Retry-After"), r.header.Values("Set-Cookie"), retryAfter)
		}
	}

	wantLogin("the right token first", login(adminToken))
	for i := 1; i < operate.MaxLoginFailures; i++ {
		wantRefused(fmt.Sprintf("failure %d", i), login("wrong"))
		clock.advance(time.Second)
	}
	// Below the limit the right token works, and does not count.
	for range 3 {
		wantLogin("the right token below the limit", login(adminToken))
	}
	wantRefused("the last failure allowed", login("wrong")) // 4 s into the window
	wantLimited("one more", login("wrong"), "56")
	wantLogin("the right token, accepted before, over the limit", login(adminToken))
	// The peer's address counts, not a header any client can send.
	wantLimited("with X-Forwarded-For", login("wrong", func(r *http.Request) { r.Header.Set("X-Forwarded-For", "192.0.2.99") }), "56")
	// Another address is not held back.
	req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(url.Values{"token": {adminToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.RemoteAddr = "192.0.2.7:40000"
	rec := httptest.NewRecorder()
	s.router.ServeHTTP(rec, req)
	if rec.Code != http.StatusSeeOther {
		t.Errorf("login from another address: %d, want 303", rec.Code)
	}
	// A refused post from another origin is not a login attempt.
	if r := login("wrong", func(r *http.Request) { r.Header.Set("Origin", "http://attacker.example") }); r.status != http.StatusForbidden {
		t.Errorf("cross-origin login while limited: %d, want 403", r.status)
	}

	clock.advance(55*time.Second + 500*time.Millisecond)
	wantLimited("half a second before the window ends", login("wrong"), "1")
	clock.advance(500 * time.Millisecond)
	wantLogin("the right token after the window", login(adminToken))
	for i := 1; i < operate.MaxLoginFailures; i++ {
		wantRefused(fmt.Sprintf("failure %d of a new window", i), login("wrong"))
	}
	wantRefused("the last failure of a new window", login("wrong"))
	wantLimited("over the limit again", login("wrong"), "60")
}

// TestPageLookup: a call is found by principal and key, with its effects
// and their buttons; an unknown key says so; a bad key or principal is
// refused with the reason.
func TestPageLookup(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	// The model's tool-call id, as a host sent it; the page escapes it.
	if _, err := db.Exec(`UPDATE calls SET tool_call_id = 'toolu_<b>4' WHERE key = 'operate-4'`); err != nil {
		t.Fatal(err)
	}
	s := newPageServer(t, path, nil)
	lookup := func(principal, key string) *pageResponse {
		t.Helper()
		r := s.post(t, "/lookup", url.Values{"principal": {principal}, "key": {key}})
		if r.status != http.StatusOK {
			t.Fatalf("lookup %q %q: %d", principal, key, r.status)
		}
		return r
	}
	r := lookup("", "operate-4")
	wantContains(t, "known key", r.raw, `<span class="badge s-completed">completed</span>`, "<dd>charge</dd>",
		`id="lookup-effect-4"`, `<span class="badge s-dead">dead</span>`, `action="/effects/4/retry"`,
		operate.KeyHash(callkey.LocalPrincipal, "operate-4"), "Recorded result", "charge_id",
		"<dt>tool call id</dt><dd><code>toolu_&lt;b&gt;4</code></dd>")
	if r := lookup("local", "operate-5"); !strings.Contains(r.raw, `id="lookup-effect-5"`) || !strings.Contains(r.raw, `value="retry"`) {
		t.Error("lookup by the explicit principal local: not effect 5 with its resolve buttons")
	}
	for _, tc := range []struct{ principal, key string }{{"", "never-made"}, {"alice", "operate-4"}} {
		r := lookup(tc.principal, tc.key)
		wantContains(t, "unknown key", r.body, "No call with this key within the retention window")
		if strings.Contains(r.raw, "lookup-effect-") {
			t.Errorf("lookup %q %q shows effects", tc.principal, tc.key)
		}
	}
	for _, tc := range []struct{ principal, key, want string }{
		{"", "", "give the call's idempotency key"},
		{"", "bad\x01key", "control character U+0001"},
		{"", strings.Repeat("k", 256), "256 bytes, the limit is 255"},
		{"bad\nprincipal", "operate-4", `principal "bad principal": want local, or a token's principal such as alice`},
		{strings.Repeat("p", 300), "operate-4", "want local, or a token's principal such as alice"},
	} {
		r := lookup(tc.principal, tc.key)
		wantContains(t, "refused lookup", r.body, tc.want)
		if strings.Contains(r.raw, "lookup-effect-") {
			t.Errorf("refused lookup %q %q shows effects", tc.principal, tc.key)
		}
	}
	if r := s.post(t, "/lookup", url.Values{"key": {"operate-4"}, "tool": {"charge"}}); !strings.Contains(r.body, `unexpected form field "tool"`) {
		t.Error("lookup with a stray field: not refused")
	}
}

// TestPageKeyHashMatchesLogs: the page names a call by the hash the call
// event in the logs carries, so that an operator can find one in the other.
func TestPageKeyHashMatchesLogs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := schema.Open(ctx, filepath.Join(t.TempDir(), "ledger.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := ledger.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	layer, err := outbox.New(db, &outbox.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	server := layer.NewServer(&mcp.Implementation{Name: "page-hash-test", Version: "v0"}, nil)
	ledger.Register(layer, server, nil)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "page-hash-client", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustSucceed(t, cs, chargeCall("hash-me", 100))
	cs.Close()
	ss.Wait()
	var logged []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct{ Msg, Key string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "call" {
			logged = append(logged, rec.Key)
		}
	}
	if want := operate.KeyHash(callkey.LocalPrincipal, "hash-me"); !slices.Equal(logged, []string{want}) {
		t.Errorf("call events carry keys %q, the page shows %s", logged, want)
	}
}

// TestPageDeliveryHistory: deliveries and failures land in the bucket of
// their time, the chart's tallest bar fills the plot, and an empty bucket
// draws nothing.
func TestPageDeliveryHistory(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 6)
	end := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	at := func(id int64, state string, ago time.Duration) {
		t.Helper()
		ts := end.Add(-ago).UnixMilli()
		var delivered any
		if state == "delivered" {
			delivered = ts
		}
		if _, err := db.Exec(`UPDATE effects SET state = ?, delivered_at = ?, updated_at = ? WHERE id = ?`, state, delivered, ts, id); err != nil {
			t.Fatal(err)
		}
	}
	at(1, "delivered", 30*time.Second)              // last bucket
	at(2, "delivered", 90*time.Second)              // the one before
	at(3, "delivered", 61*time.Minute)              // before the window
	at(4, "dead", 10*time.Second)                   // last bucket
	at(5, "unknown", 59*time.Minute+30*time.Second) // first bucket
	at(6, "delivered", -1*time.Millisecond)         // at the end: after the window
	read, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { read.Close() })
	buckets, err := opsquery.DeliveryHistory(context.Background(), read, end, time.Minute, 60)
	if err != nil {
		t.Fatal(err)
	}
	if len(buckets) != 60 || !buckets[0].Start.Equal(end.Add(-time.Hour)) {
		t.Fatalf("%d buckets from %v, want 60 from %v", len(buckets), buckets[0].Start, end.Add(-time.Hour))
	}
	got := map[int]opsquery.Bucket{}
	for i, b := range buckets {
		if b.Delivered+b.Failed > 0 {
			got[i] = b
		}
	}
	want := map[int][2]int{0: {0, 1}, 58: {1, 0}, 59: {1, 1}}
	if len(got) != len(want) {
		t.Errorf("non-empty buckets %v, want %v", got, want)
	}
	for i, w := range want {
		if got[i].Delivered != w[0] || got[i].Failed != w[1] {
			t.Errorf("bucket %d: %+v, want %d delivered, %d failed", i, got[i], w[0], w[1])
		}
	}
	// operator's TestNewChart draws these buckets.
	if _, err := opsquery.DeliveryHistory(context.Background(), read, end, 0, 60); err == nil {
		t.Error("a zero step: no error")
	}
}

// chromiumPath is where Debian's chromium package puts the browser.
const chromiumPath = "/usr/bin/chromium"

// TestOperatorPageBrowser drives the page in headless Chromium against a
// real `serve --http` process and a fake destination: log in with the admin
// token, find the effect the destination refused among the dead ones,
// click retry, and see it delivered, on the page and at the destination;
// then settle an unknown call.
// With MCP_OUTBOX_SCREENSHOT=FILE it first saves a PNG of the whole page,
// with an hour of staged history in the chart (the README's picture:
// MCP_OUTBOX_SCREENSHOT=$PWD/testdata/screenshots/operator-page.png).
func TestOperatorPageBrowser(t *testing.T) {
	requireBrowser(t)
	screenshot := os.Getenv("MCP_OUTBOX_SCREENSHOT")
	// Not parallel: a browser is the heaviest thing in the suite, and runs
	// best while nothing else does.

	fake := downstream.Start(t, nil)
	adminToken, _ := newTokenFor(t, "admin")
	aliceToken, _ := newTokenFor(t, "alice")
	bobToken, _ := newTokenFor(t, "bob")
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	// at_most_once, so that a request left without an answer becomes
	// unknown, which the page must show too.
	mcpURL, _ := startHTTP(t, bin, dbPath, []string{"MCP_OUTBOX_TOKENS=alice=" + sha256Hex(aliceToken) + ",bob=" + sha256Hex(bobToken)},
		"--dest", paymentsDest(fake, "at_most_once", "timeout=500ms"), "--admin-token-sha256", sha256Hex(adminToken))
	base := strings.TrimSuffix(mcpURL, "/mcp")
	alice := connectHTTP(t, mcpURL, "", bearerClient(t, aliceToken))
	bob := connectHTTP(t, mcpURL, "", bearerClient(t, bobToken))
	db := openLedgerDB(t, dbPath)
	if screenshot != "" {
		stageHistory(t, alice, bob, db)
	}

	fake.FailNext(1, downstream.Status(http.StatusBadRequest))
	mustSucceed(t, alice, chargeCall("order-1001", 4200))
	dead := waitCallEffect(t, db, "order-1001", "dead")
	fake.FailNext(1, downstream.Hang())
	mustSucceed(t, bob, chargeCall("order-1002", 1250))
	unknown := waitCallEffect(t, db, "order-1002", "unknown")
	for i, key := range []string{"order-1003", "order-1004", "order-1005"} {
		mustSucceed(t, alice, chargeCall(key, 900+100*i))
		waitCallEffect(t, db, key, "delivered")
	}
	// An unknown call, as mcp-outbox proxy leaves one when a tool server's
	// answer is lost, in the same database.
	now := time.Now()
	lostCall := addPageUnknownCall(t, db, "user:bob", "order-1006", now.Add(-3*time.Minute).UnixMilli(), now.Add(-2*time.Minute).UnixMilli())

	ctx := newBrowser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("open the page: %v", err)
	}
	if loc := browserLocation(t, ctx); loc != base+"/login" {
		t.Fatalf("the page without login is at %s, want %s/login", loc, base)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("token"), adminToken)); err != nil {
		t.Fatal(err)
	}
	clickAndLoad(t, ctx, `form.login button`)
	if loc := browserLocation(t, ctx); loc != base+"/" {
		t.Fatalf("after login the browser is at %s, want %s/", loc, base)
	}
	for _, sel := range []string{fmt.Sprintf("#effect-%d", dead.id), fmt.Sprintf("#effect-%d", unknown.id), fmt.Sprintf("#call-%d", lostCall)} {
		if !browserHas(t, ctx, sel) {
			t.Fatalf("the page has no %s", sel)
		}
	}
	if screenshot != "" {
		saveScreenshot(t, ctx, screenshot)
	}

	clickAndLoad(t, ctx, fmt.Sprintf(`#effect-%d form[action="/effects/%d/retry"] button`, dead.id, dead.id))
	if msg := browserText(t, ctx, ".flash.done"); !strings.Contains(msg, fmt.Sprintf("Effect %d", dead.id)) || !strings.Contains(msg, "dead, now pending") {
		t.Errorf("after retry the page says %q", msg)
	}

	// The page: the effect leaves the dead ones, and a lookup of its call
	// shows it delivered.
	pollUntil(t, 30*time.Second, "the page to show the retried effect delivered", func() bool {
		if err := chromedp.Do(ctx, chromedp.Navigate(base+"/")); err != nil {
			t.Fatal(err)
		}
		if browserHas(t, ctx, fmt.Sprintf("#effect-%d", dead.id)) {
			return false
		}
		if err := chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`form.lookup input[name="principal"]`), "user:alice"),
			chromedp.SendKeys(chromedp.CSS(`form.lookup input[name="key"]`), "order-1001")); err != nil {
			t.Fatal(err)
		}
		clickAndLoad(t, ctx, "form.lookup button")
		return browserText(t, ctx, fmt.Sprintf("#lookup-effect-%d .badge", dead.id)) == "delivered"
	})
	if !browserHas(t, ctx, fmt.Sprintf("#effect-%d", unknown.id)) {
		t.Error("the unknown effect left the page")
	}
	// The destination: refused once, then executed once.
	pollUntil(t, 30*time.Second, "the destination to apply the retried effect", func() bool {
		return len(requestsFor(fake, dead.key)) == 2
	})
	reqs := requestsFor(fake, dead.key)
	if reqs[0].Outcome != downstream.Faulted || reqs[0].Status != http.StatusBadRequest || reqs[1].Outcome != downstream.Executed {
		t.Errorf("requests with the retried effect's key: %+v, want refused with 400, then executed", reqs)
	}
	if st := stateOf(t, db, dead.id); st != "delivered" {
		t.Errorf("effect %d is %s in the database, want delivered", dead.id, st)
	}

	// The unknown call: settle it as completed, with a note.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatal(err)
	}
	settle := fmt.Sprintf("#call-%d form.settle", lostCall)
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(settle+` select[name="outcome"]`), "completed"),
		chromedp.SendKeys(chromedp.CSS(settle+` input[name="note"]`), "charge ch_9 is at the processor")); err != nil {
		t.Fatal(err)
	}
	clickAndLoad(t, ctx, settle+" button")
	if msg := browserText(t, ctx, ".flash.done"); !strings.Contains(msg, fmt.Sprintf("Call %d (charge of user:bob", lostCall)) || !strings.Contains(msg, "was unknown, now completed") {
		t.Errorf("after settling the page says %q", msg)
	}
	if browserHas(t, ctx, fmt.Sprintf("#call-%d", lostCall)) {
		t.Error("the settled call is still listed")
	}
	if st, res := callStateOf(t, db, "user:bob", "order-1006"); st != "completed" || !strings.Contains(res, "[resolved by an operator] charge ch_9 is at the processor") {
		t.Errorf("the settled call in the database: %s %s", st, res)
	}
}

// callEffect is the first effect of a call, as the browser test needs it.
type callEffect struct {
	id  int64
	key string // its Idempotency-Key
}

// waitCallEffect polls until the first effect of the call with key is in
// state, and returns it.
func waitCallEffect(t *testing.T, db *sql.DB, key, state string) callEffect {
	t.Helper()
	var e callEffect
	var got string
	pollUntil(t, 30*time.Second, fmt.Sprintf("the effect of %s to be %s", key, state), func() bool {
		err := db.QueryRow(`SELECT e.id, e.idempotency_key, e.state FROM effects e JOIN calls c ON c.id = e.call_id
WHERE c.key = ? AND e.seq = 1`, key).Scan(&e.id, &e.key, &got)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		return got == state
	})
	return e
}

// requireBrowser skips the test without Chromium, or under -short, unless
// MCP_OUTBOX_REQUIRE_BROWSER=1, which makes a missing browser a failure.
func requireBrowser(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("MCP_OUTBOX_REQUIRE_BROWSER") == "1" {
			t.Fatalf("MCP_OUTBOX_REQUIRE_BROWSER=1, but there is no browser: %v (apt-get install chromium)", err)
		}
		t.Skipf("no Chromium at %s (apt-get install chromium; MCP_OUTBOX_REQUIRE_BROWSER=1 makes this a failure)", chromiumPath)
	}
	if testing.Short() && os.Getenv("MCP_OUTBOX_REQUIRE_BROWSER") != "1" {
		t.Skip("-short: no browser")
	}
}

// newBrowser starts headless Chromium with a profile of its own and
// returns a tab's context, which ends with the test. The flags keep it
// from reaching out to the network: without them it hangs on the refused
// connections of its background services.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900))
	ctx, cancel := chromedp.NewContext(allocCtx)
	// Cleanups run last in first: the tab, the browser, then its profile
	// directory (registered above by t.TempDir).
	t.Cleanup(cancelAlloc)
	t.Cleanup(cancel)
	// Start the browser now, under the test's context, not under the
	// timeout of the first action.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromiumPath, err)
	}
	return ctx
}

// browserStep bounds one browser action, so that a page that never loads
// fails the test rather than hanging it.
func browserStep(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 30*time.Second)
}

func browserLocation(t *testing.T, ctx context.Context) string {
	t.Helper()
	sctx, cancel := browserStep(ctx)
	defer cancel()
	loc, err := chromedp.Run(sctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// clickAndLoad clicks a form's button and waits for the page it loads.
func clickAndLoad(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	sctx, cancel := browserStep(ctx)
	defer cancel()
	resp, err := chromedp.RunResponse(sctx, chromedp.Click(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("click %s: %v", sel, err)
	}
	if resp == nil || resp.Status != http.StatusOK {
		t.Fatalf("click %s: response %+v", sel, resp)
	}
}

func browserHas(t *testing.T, ctx context.Context, sel string) bool {
	t.Helper()
	sctx, cancel := browserStep(ctx)
	defer cancel()
	js, err := json.Marshal(sel)
	if err != nil {
		t.Fatal(err)
	}
	has, err := chromedp.Run(sctx, chromedp.Evaluate[bool](fmt.Sprintf("document.querySelector(%s) !== null", js)))
	if err != nil {
		t.Fatalf("look for %s: %v", sel, err)
	}
	return has
}

// browserText is the text of the first element sel matches, or "" when
// none does.
func browserText(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	if !browserHas(t, ctx, sel) {
		return ""
	}
	sctx, cancel := browserStep(ctx)
	defer cancel()
	text, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(text)
}

// saveScreenshot writes a PNG of the whole page, as tall as it is.
func saveScreenshot(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	sctx, cancel := browserStep(ctx)
	defer cancel()
	height, err := chromedp.Run(sctx, chromedp.Evaluate[int64]("document.documentElement.scrollHeight"))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(sctx, chromedp.EmulateViewport(1280, height)); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(sctx, chromedp.ResetViewport()); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("saved a screenshot of the page to %s", path)
}

// stageHistory makes the chart of the screenshot look like an hour of
// traffic: real charges, delivered by the real dispatcher, whose times are
// then moved back over the last hour (the page reads nothing but these
// columns). Only the picture uses it; the assertions run without it.
func stageHistory(t *testing.T, alice, bob *mcp.ClientSession, db *sql.DB) {
	t.Helper()
	const n = 48
	for i := range n {
		cs := alice
		if i%3 == 0 {
			cs = bob
		}
		mustSucceed(t, cs, chargeCall(fmt.Sprintf("invoice-%04d", 7000+i), 500+37*i))
	}
	pollUntil(t, 60*time.Second, "every effect delivered", func() bool {
		return countRows(t, db, `SELECT count(*) FROM effects WHERE state = 'delivered'`) == n
	})
	// Busier in the last twenty minutes, as after a deploy; the oldest
	// time goes to the first call.
	var ago []time.Duration
	for i := range n {
		minutesAgo := 58 - (i*i)%57
		if i >= n/2 {
			minutesAgo = 2 + (i*7)%20
		}
		ago = append(ago, time.Duration(minutesAgo)*time.Minute+time.Duration(i*13%60)*time.Second)
	}
	slices.Sort(ago)
	slices.Reverse(ago)
	now := time.Now()
	for i := range n {
		at := now.Add(-ago[i]).UnixMilli()
		id := int64(i + 1)
		if _, err := db.Exec(`UPDATE effects SET created_at = ?1, updated_at = ?1 + 40, delivered_at = ?1 + 40 WHERE id = ?2`, at, id); err != nil {
			t.Fatal(err)
		}
		took := 1 + i%4 // milliseconds, as these calls take here
		if _, err := db.Exec(`UPDATE calls SET created_at = ?1 - ?3, completed_at = ?1 WHERE id = (SELECT call_id FROM effects WHERE id = ?2)`, at, id, took); err != nil {
			t.Fatal(err)
		}
	}
}
