package bearer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/guesslimit"
)

// syncBuffer is a log other goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestRequire_GuessLimit: past guesslimit.MaxTokenFailures refused tokens
// from one address in a minute, the address gets 429 with Retry-After
// and the verifier is not asked (not even for the right token, never
// accepted before: see TestRequire_KnownTokenPastLimit); another
// address is not affected; the window's end opens it again. A missing
// token, a malformed header and a verifier that cannot decide count for
// nothing. Ten thousand guesses make two log lines.
func TestRequire_GuessLimit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var asked atomic.Int64
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		asked.Add(1)
		switch token {
		case "right":
			return &auth.TokenInfo{UserID: "alice", Expiration: noExpiry}, nil
		case "issuer-down":
			return nil, errors.New("fetch keys: connection refused")
		}
		return nil, auth.ErrInvalidToken
	}
	var logs syncBuffer
	h := Require(verify, &RequireOptions{Realm: realm, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	const guesser, other = "203.0.113.7:40000", "[2001:db8::1]:40000"
	send := func(remote, authorization string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		req.RemoteAddr = remote
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
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
	for range 2 * guesslimit.MaxTokenFailures {
		want(send(guesser, ""), http.StatusUnauthorized, "no token")
		want(send(guesser, "Bearer a b"), http.StatusBadRequest, "a malformed header")
		want(send(guesser, "Bearer issuer-down"), http.StatusServiceUnavailable, "the issuer down")
	}
	for range guesslimit.MaxTokenFailures {
		want(send(guesser, "Bearer guess"), http.StatusUnauthorized, "a wrong token")
	}
	before := asked.Load()
	for _, authorization := range []string{"Bearer guess", "Bearer right", ""} {
		rec := send(guesser, authorization)
		want(rec, http.StatusTooManyRequests, "past the limit: "+authorization)
		if ra := rec.Header().Get("Retry-After"); ra != "60" {
			t.Errorf("past the limit: Retry-After %q, want 60", ra)
		}
	}
	if n := asked.Load() - before; n != 0 {
		t.Errorf("the verifier was asked %d times past the limit", n)
	}
	want(send(other, "Bearer right"), http.StatusOK, "the right token from another address")

	for range 10_000 {
		send(guesser, "Bearer guess")
	}
	mu.Lock()
	now = now.Add(guesslimit.Window)
	mu.Unlock()
	want(send(guesser, "Bearer right"), http.StatusOK, "the right token after the window")
	want(send(guesser, "Bearer guess"), http.StatusUnauthorized, "a wrong token after the window") // ends the log's period
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, "authentication") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[0], "over the limit") || !strings.Contains(lines[1], "refused_unchecked=10003") ||
		!strings.Contains(lines[1], "surface=\"bearer tokens\"") {
		t.Errorf("the log of 10,000 guesses:\n%s", strings.Join(lines, "\n"))
	}
}

// TestVerifier_RequireGuessLimit: the static tokens' Require has the limit.
func TestVerifier_RequireGuessLimit(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte("right"))
	v := NewVerifier([]Token{{Principal: "alice", Hash: sum[:]}})
	h := v.Require(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i := range guesslimit.MaxTokenFailures + 1 {
		req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		req.Header.Set("Authorization", "Bearer guess")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if want := map[bool]int{true: 429, false: 401}[i == guesslimit.MaxTokenFailures]; rec.Code != want {
			t.Fatalf("wrong token %d: status %d, want %d", i+1, rec.Code, want)
		}
	}
}

// TestRequire_KnownTokenPastLimit: behind a reverse proxy every client has
// the proxy's address, so a guesser must not lock out the clients at
// work. From one address: a token accepted once is still verified and
// admitted past the limit; a right token never accepted before gets 429
// (the documented trade-off), and so does a wrong one, unverified. The
// known token is refused again once guesslimit.KnownFor has passed since
// its last success, or its own expiry, with the address over the limit.
func TestRequire_KnownTokenPastLimit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := start
	setNow := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	var asked atomic.Int64
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		asked.Add(1)
		switch token {
		case "right", "never-seen":
			return &auth.TokenInfo{UserID: "alice", Expiration: noExpiry}, nil
		case "short-lived": // an OAuth token, say
			return &auth.TokenInfo{UserID: "bob", Expiration: start.Add(10 * time.Minute)}, nil
		}
		return nil, auth.ErrInvalidToken
	}
	var logs syncBuffer
	h := Require(verify, &RequireOptions{Realm: realm, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	send := func(token string) int {
		req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		req.RemoteAddr = "127.0.0.1:40000" // the reverse proxy's
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	want := func(token string, status int, what string) {
		t.Helper()
		if got := send(token); got != status {
			t.Fatalf("%s: status %d, want %d", what, got, status)
		}
	}
	guess := func() {
		t.Helper()
		for i := range 25 {
			want(fmt.Sprintf("guess-%d", i), map[bool]int{true: 401, false: 429}[i < guesslimit.MaxTokenFailures], "a wrong token")
		}
	}

	want("right", http.StatusOK, "the right token")
	want("short-lived", http.StatusOK, "a short-lived token")
	guess()
	before := asked.Load()
	want("right", http.StatusOK, "the token accepted before, past the limit")
	want("short-lived", http.StatusOK, "the short-lived token accepted before, past the limit")
	if n := asked.Load() - before; n != 2 {
		t.Errorf("the known tokens were verified %d times past the limit, want 2", n)
	}
	before = asked.Load()
	want("never-seen", http.StatusTooManyRequests, "a right token never accepted before, past the limit")
	want("guess", http.StatusTooManyRequests, "a wrong token past the limit")
	if n := asked.Load() - before; n != 0 {
		t.Errorf("the verifier was asked %d times for unknown tokens past the limit", n)
	}

	setNow(start.Add(10 * time.Minute)) // the short-lived token's expiry
	guess()
	want("right", http.StatusOK, "the known token, 10 minutes on")
	want("short-lived", http.StatusTooManyRequests, "the short-lived token at its expiry")
	setNow(start.Add(10*time.Minute + guesslimit.KnownFor))
	guess()
	want("right", http.StatusTooManyRequests, "the known token, guesslimit.KnownFor after its last success")
	setNow(start.Add(10*time.Minute + guesslimit.KnownFor + guesslimit.Window))
	want("right", http.StatusOK, "the right token after the window") // ends the log's period
	if !strings.Contains(logs.String(), "known_let_through=2 ") {
		t.Errorf("the log does not count the known tokens let through:\n%s", logs.String())
	}
}
