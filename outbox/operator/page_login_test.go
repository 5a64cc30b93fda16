package operator

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestPageSessions: sessions expire, and the store stays bounded.
func TestPageSessions(t *testing.T) {
	t.Parallel()
	s := pageSessions{byHash: map[[32]byte]time.Time{}}
	now := time.Now()
	first := s.create(now)
	if !s.valid(first, now) || s.valid(first, now.Add(PageSessionTTL)) || s.valid("", now) || s.valid("forged", now) {
		t.Error("a session is valid only until it expires, and only its own id")
	}
	for i := 0; i < maxPageSessions+10; i++ {
		s.create(now.Add(time.Duration(i+1) * time.Millisecond))
	}
	if n := len(s.byHash); n > maxPageSessions {
		t.Errorf("%d sessions kept, want at most %d", n, maxPageSessions)
	}
	if s.valid(first, now) {
		t.Error("the oldest session survived a full store")
	}
}

// TestPageLoginLimiter: windows end, the table stays bounded, and clients
// are told apart by address (an IPv6 client by its /64).
func TestPageLoginLimiter(t *testing.T) {
	t.Parallel()
	l := loginLimiter{byClient: map[string]loginFailures{}}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := 1; i <= MaxLoginFailures; i++ {
		if reached := l.fail("a", now); reached != (i == MaxLoginFailures) {
			t.Errorf("failure %d: limit reached %v", i, reached)
		}
	}
	if w := l.blocked("a", now.Add(10*time.Second)); w != loginWindow-10*time.Second {
		t.Errorf("blocked for %v, want %v", w, loginWindow-10*time.Second)
	}
	if w := l.blocked("b", now); w != 0 {
		t.Errorf("another client blocked for %v", w)
	}
	if w := l.blocked("a", now.Add(loginWindow)); w != 0 || len(l.byClient) != 0 {
		t.Errorf("after the window: blocked %v, %d clients kept", w, len(l.byClient))
	}
	// Full: ended windows go first, then the oldest.
	l.fail("old", now)
	for i := range maxLoginClients - 1 {
		l.fail(fmt.Sprintf("c%d", i), now.Add(time.Second+time.Duration(i)*time.Millisecond))
	}
	for range MaxLoginFailures {
		l.fail("c0", now.Add(2*time.Second))
	}
	l.fail("new-1", now.Add(loginWindow)) // "old"'s window has ended
	if _, ok := l.byClient["old"]; ok || len(l.byClient) != maxLoginClients {
		t.Errorf("a full table with an ended window: %d clients, old kept %v", len(l.byClient), ok)
	}
	l.fail("new-2", now.Add(loginWindow+time.Second/2))
	if _, ok := l.byClient["c0"]; ok || len(l.byClient) != maxLoginClients {
		t.Errorf("a full table: %d clients, the oldest (c0) kept %v", len(l.byClient), ok)
	}
	for remote, want := range map[string]string{
		"192.0.2.7:40000":              "192.0.2.7",
		"[::ffff:192.0.2.7]:40000":     "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:40000": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ff::1]:1":       "2001:db8:1:2::/64",
		"[fe80::1%eth0]:1":             "fe80::/64",
		"not-an-address":               "not-an-address",
	} {
		if got := loginClient(&http.Request{RemoteAddr: remote}); got != want {
			t.Errorf("loginClient(%q) = %q, want %q", remote, got, want)
		}
	}
}
