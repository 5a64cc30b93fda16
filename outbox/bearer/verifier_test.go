package bearer_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

// TestNewVerifier_RefusesHexHash: the hex that Hash returns, converted with
// []byte, compiles as a Token's Hash and would refuse the right token as a
// wrong one; NewVerifier says so where the mistake is made.
func TestNewVerifier_RefusesHexHash(t *testing.T) {
	defer func() {
		msg := fmt.Sprint(recover())
		if !strings.Contains(msg, `principal "alice"`) || !strings.Contains(msg, "64 bytes") || !strings.Contains(msg, "ParseHash") {
			t.Fatalf("NewVerifier with a hex Hash: panic %q, want one naming the principal, the length and ParseHash", msg)
		}
	}()
	bearer.NewVerifier([]bearer.Token{{Principal: "alice", Hash: []byte(bearer.Hash("alice-token"))}})
}

// TestRequire_EmptyVerifierWarns: an empty Verifier lets every request
// through, which an unset variable or an empty file also gives; Require
// says so in the log rather than serving an open server quietly.
func TestRequire_EmptyVerifierWarns(t *testing.T) {
	var logs bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	h := bearer.NewVerifier(nil).Require(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mcp", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("empty Verifier: %d, want the request let through", rec.Code)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "unauthenticated") {
		t.Fatalf("empty Verifier: log %q, want a warning that every request is let through", logs.String())
	}
}
