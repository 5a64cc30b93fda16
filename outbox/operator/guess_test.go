package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/guesslimit"
)

// TestOperatorGuessLimit: wrong admin tokens in the header (admin API,
// metrics, page) and at the login form, and refused OAuth tokens, share
// one budget per client address. Past it the client gets 429 with
// Retry-After, the token not looked at (not even the right one, never
// accepted before: see TestOperatorKnownTokenPastLimit; and the OAuth
// verifier not asked); a client at another address is not affected;
// the window's end opens it again. A missing token and an issuer that
// cannot answer count for nothing, and a flood of guesses makes a few log
// lines, not one per guess.
func TestOperatorGuessLimit(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	var logs lockedBuffer
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var verified atomic.Int64
	h, err := NewHandler(context.Background(), db, &Options{
		AdminTokenSHA256: adminHash(),
		Logger:           slog.New(slog.NewTextHandler(&logs, nil)),
		Now:              clock,
		OAuth: &OAuth{ReadScope: "ops:read", ActScope: "ops:act",
			Verify: func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
				verified.Add(1)
				if token == "issuer-down" {
					return nil, errors.New("fetch keys: connection refused")
				}
				return nil, auth.ErrInvalidToken
			}},
	})
	if err != nil {
		t.Fatal(err)
	}
	const guesser, other = "203.0.113.7:40000", "198.51.100.9:40000"
	send := func(remote, method, path, token string, form url.Values) *httptest.ResponseRecorder {
		t.Helper()
		var req *http.Request
		if form != nil {
			req = httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		} else {
			req = httptest.NewRequest(method, path, nil)
		}
		req.RemoteAddr, req.Host = remote, "ops.example.com"
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	want := func(rec *httptest.ResponseRecorder, status int, what string) {
		t.Helper()
		if rec.Code != status {
			t.Fatalf("%s: status %d, want %d: %s", what, rec.Code, status, rec.Body)
		}
	}

	for range 10 {
		want(send(guesser, "GET", "/admin/effects", "", nil), http.StatusUnauthorized, "no token")
		want(send(guesser, "GET", "/admin/effects", "issuer-down", nil), http.StatusServiceUnavailable, "issuer down")
	}
	// operate.MaxLoginFailures wrong tokens, over every way in.
	want(send(guesser, "GET", "/admin/effects", "guess-1", nil), http.StatusUnauthorized, "a wrong token on the admin API")
	want(send(guesser, "GET", "/metrics", "guess-2", nil), http.StatusUnauthorized, "a wrong token on the metrics")
	want(send(guesser, "GET", "/", "guess-3", nil), http.StatusUnauthorized, "a wrong token on the page")
	want(send(guesser, "POST", "/login", "", url.Values{"token": {"guess-4"}}), http.StatusUnauthorized, "a wrong login")
	for i := 5; i <= operate.MaxLoginFailures; i++ {
		want(send(guesser, "POST", "/admin/effects/retry-dead", "guess", nil), http.StatusUnauthorized, "a wrong token")
	}
	asked := verified.Load()
	for _, c := range []struct{ method, path, token string }{
		{"GET", "/admin/effects", testAdminToken}, {"GET", "/admin/effects", "guess"}, {"GET", "/metrics", "guess"},
		{"GET", "/", "guess"}, {"GET", "/admin/effects", ""},
	} {
		rec := send(guesser, c.method, c.path, c.token, nil)
		want(rec, http.StatusTooManyRequests, "past the limit: "+c.path+" "+c.token)
		if ra := rec.Header().Get("Retry-After"); ra != "60" {
			t.Errorf("past the limit: Retry-After %q, want 60", ra)
		}
	}
	rec := send(guesser, "POST", "/login", "", url.Values{"token": {testAdminToken}})
	want(rec, http.StatusTooManyRequests, "a login past the limit")
	if rec.Header().Get("Retry-After") == "" {
		t.Error("a login past the limit: no Retry-After")
	}
	if n := verified.Load(); n != asked {
		t.Errorf("the OAuth verifier was asked %d times past the limit", n-asked)
	}
	want(send(other, "GET", "/admin/effects", testAdminToken, nil), http.StatusOK, "the admin token from another address")

	for range 10_000 {
		send(guesser, "GET", "/admin/effects", "guess", nil)
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	want(send(guesser, "GET", "/admin/effects", testAdminToken, nil), http.StatusOK, "the admin token after the window")
	want(send(guesser, "GET", "/admin/effects", "guess", nil), http.StatusUnauthorized, "a wrong token after the window") // ends the log's period

	var guessLines []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, "authentication") {
			guessLines = append(guessLines, l)
		}
	}
	if len(guessLines) != 2 || !strings.Contains(guessLines[0], "over the limit") ||
		!strings.Contains(guessLines[1], "refused_unchecked=10006") || !strings.Contains(guessLines[1], "failures=5 ") {
		t.Errorf("the log of 10,000 guesses:\n%s", strings.Join(guessLines, "\n"))
	}
}

// TestOperatorKnownTokenPastLimit: behind a reverse proxy every operator
// has the proxy's address, so a guesser must not lock out the operators
// at work. From one address past the limit: the admin token, once
// accepted, is still admitted (header on /admin and /metrics, and the
// login form), and so is an OAuth token accepted before, verified again;
// a right token not accepted before gets 429 (the documented trade-off),
// and a wrong one too, unverified. A known token is refused again once
// guesslimit.KnownFor has passed since its last success, an OAuth token
// at its expiry, with the address over the limit.
func TestOperatorKnownTokenPastLimit(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	var mu sync.Mutex
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := start
	setNow := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	var verified atomic.Int64
	h, err := NewHandler(context.Background(), db, &Options{
		AdminTokenSHA256: adminHash(),
		Logger:           slog.New(slog.DiscardHandler),
		Now:              func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		OAuth: &OAuth{ReadScope: "ops:read", ActScope: "ops:act",
			Verify: func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
				verified.Add(1)
				switch token {
				case "oauth-good", "oauth-new":
					return &auth.TokenInfo{UserID: "ops", Scopes: []string{"ops:read"}, Expiration: start.Add(24 * time.Hour)}, nil
				case "oauth-short":
					return &auth.TokenInfo{UserID: "ops", Scopes: []string{"ops:read"}, Expiration: start.Add(10 * time.Minute)}, nil
				}
				return nil, auth.ErrInvalidToken
			}},
	})
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, path, token string, form url.Values) int {
		var req *http.Request
		if form != nil {
			req = httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		} else {
			req = httptest.NewRequest(method, path, nil)
		}
		req.RemoteAddr, req.Host = "127.0.0.1:40000", "ops.example.com" // the reverse proxy's
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	want := func(got, status int, what string) {
		t.Helper()
		if got != status {
			t.Fatalf("%s: status %d, want %d", what, got, status)
		}
	}
	guess := func() {
		t.Helper()
		for i := range 25 {
			want(send("GET", "/admin/effects", fmt.Sprintf("guess-%d", i), nil),
				map[bool]int{true: 401, false: 429}[i < operate.MaxLoginFailures], "a wrong token")
		}
	}
	login := url.Values{"token": {testAdminToken}}

	guess()
	want(send("GET", "/admin/effects", testAdminToken, nil), http.StatusTooManyRequests, "the admin token never accepted, past the limit")
	want(send("POST", "/login", "", login), http.StatusTooManyRequests, "a login never accepted, past the limit")
	setNow(start.Add(guesslimit.Window))
	want(send("GET", "/admin/effects", testAdminToken, nil), http.StatusOK, "the admin token after the window")
	want(send("GET", "/admin/effects", "oauth-good", nil), http.StatusOK, "an OAuth token")
	want(send("GET", "/admin/effects", "oauth-short", nil), http.StatusOK, "a short-lived OAuth token")

	guess()
	before := verified.Load()
	want(send("GET", "/admin/effects", testAdminToken, nil), http.StatusOK, "the admin token accepted before, past the limit")
	want(send("GET", "/metrics", testAdminToken, nil), http.StatusOK, "the admin token on the metrics, past the limit")
	want(send("POST", "/login", "", login), http.StatusSeeOther, "a login with the admin token, past the limit")
	want(send("GET", "/admin/effects", "oauth-good", nil), http.StatusOK, "an OAuth token accepted before, past the limit")
	if n := verified.Load() - before; n != 1 {
		t.Errorf("the OAuth token accepted before was verified %d times past the limit, want 1", n)
	}
	before = verified.Load()
	want(send("GET", "/admin/effects", "oauth-new", nil), http.StatusTooManyRequests, "a right OAuth token never accepted, past the limit")
	want(send("GET", "/admin/effects", "guess", nil), http.StatusTooManyRequests, "a wrong token past the limit")
	if n := verified.Load() - before; n != 0 {
		t.Errorf("the OAuth verifier was asked %d times for unknown tokens past the limit", n)
	}

	setNow(start.Add(10 * time.Minute)) // the short-lived token's expiry
	guess()
	want(send("GET", "/admin/effects", "oauth-short", nil), http.StatusTooManyRequests, "an OAuth token at its expiry, past the limit")
	want(send("GET", "/admin/effects", testAdminToken, nil), http.StatusOK, "the admin token, 10 minutes on")
	setNow(start.Add(10*time.Minute + guesslimit.KnownFor))
	guess()
	want(send("GET", "/admin/effects", testAdminToken, nil), http.StatusTooManyRequests, "the admin token, guesslimit.KnownFor after its last success")
	want(send("POST", "/login", "", login), http.StatusTooManyRequests, "a login, guesslimit.KnownFor after the last success")
}
