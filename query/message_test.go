package query_test

import (
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/query"
)

// A call made without a key has no key to retry with: its status speaks of
// an identical call instead. (The other states are checked through
// call_status in package outbox.)
func TestMessage_Keyless(t *testing.T) {
	for source, want := range map[string]string{
		"fingerprint": "If it dies, an identical call (same tool and arguments, without a key) takes over",
		"meta":        "If it dies, a retry with the same key takes over",
	} {
		got := query.Running("k", source, "charge").Message
		if !strings.Contains(got, want) {
			t.Errorf("in_flight message for a %s key: %q, want %q", source, got, want)
		}
	}
}
