package operator

import (
	"fmt"
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
