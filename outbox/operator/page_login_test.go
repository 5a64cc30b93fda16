package operator

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
)

// TestPageSessions: a session cookie is valid until it expires, only as
// its key signed it, and only while the admin token is the same.
func TestPageSessions(t *testing.T) {
	t.Parallel()
	key := subkey([]byte(strings.Repeat("k", 32)), "session")
	s := pageSessions{key: key, adminHash: []byte("hash of the admin token")}
	now := time.Now()
	v := s.create(now)
	valid := func(s pageSessions, v string, now time.Time) bool { _, _, ok := s.verify(v, now); return ok }
	if !valid(s, v, now) || !valid(s, v, now.Add(operate.PageSessionTTL-time.Second)) {
		t.Errorf("a fresh session %q is refused", v)
	}
	if valid(s, v, now.Add(operate.PageSessionTTL)) {
		t.Error("an expired session is accepted")
	}
	if v2 := s.create(now); v2 == v {
		t.Error("two sessions got one id")
	}
	p := strings.Split(v, ".")
	ver, exp, id, sig := p[0], p[1], p[2], p[3]
	longer := fmt.Sprint(now.Add(100 * operate.PageSessionTTL).Unix())
	for _, bad := range []string{"", "forged", ver + "." + longer + "." + id + "." + sig, "v0." + exp + "." + id + "." + sig,
		ver + "." + exp + "." + id + "." + sig[:len(sig)-2], ver + "." + exp + "." + id + "." + strings.Repeat("A", len(sig)),
		ver + "." + exp + ".other." + sig, ver + "." + exp + "." + id, v + "x", v + ".x"} {
		if valid(s, bad, now) {
			t.Errorf("a tampered session %q is accepted", bad)
		}
	}
	other := pageSessions{key: subkey([]byte(strings.Repeat("o", 32)), "session"), adminHash: s.adminHash}
	if valid(other, v, now) {
		t.Error("a session signed with another key is accepted")
	}
	if rotated := (pageSessions{key: key, adminHash: []byte("a new admin token")}); valid(rotated, v, now) {
		t.Error("a session survives a new admin token")
	}
	if flash := subkey([]byte(strings.Repeat("k", 32)), "flash"); string(flash) == string(key) {
		t.Error("the flash key is the session key")
	}
}

// TestPageLoginLimiter: windows end, the table stays bounded, and clients
// are told apart by address (an IPv6 client by its /64).
func TestPageLoginLimiter(t *testing.T) {
	t.Parallel()
	l := loginLimiter{byClient: map[string]loginFailures{}}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := 1; i <= operate.MaxLoginFailures; i++ {
		if reached := l.fail("a", now); reached != (i == operate.MaxLoginFailures) {
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
	for range operate.MaxLoginFailures {
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
