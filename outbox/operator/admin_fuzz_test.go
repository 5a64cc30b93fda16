package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// FuzzAdminBody sends request bodies to the admin API's actions that take
// one (POST /calls/resolve, /effects/{id}/resolve, /effects/{id}/retry),
// against a database with an unknown call and an unknown effect that every
// run puts back. The API answers every body with a JSON object and one of
// 200, 400, 404, 409 or 413, never a server error or a panic; a body that
// is not exactly one JSON object of the documented fields (or empty) is a
// 400 and changes nothing.
func FuzzAdminBody(f *testing.F) {
	for _, s := range []struct {
		target uint8
		body   string
	}{
		{0, `{"key":"lost-1","outcome":"completed","note":"found it"}`},
		{0, `{"principal":"alice","key":"lost-1","outcome":"rerun"}`},
		{0, `{"callId":"call_fuzz_lost-1","outcome":"failed"}`},
		{0, `{"callId":"call_fuzz_lost-1","key":"lost-1","outcome":"failed"}`},
		{0, `{"key":"nobody","outcome":"rerun"}`},
		{0, `{"key":"done-1","outcome":"rerun"}`},
		{0, `{"key":"lost-1","outcome":"maybe"}`},
		{0, `{"key":"lost-1","outcome":"rerun","force":true}`},
		{0, `{"key":"lost-1","outcome":"rerun"} {"key":"lost-1"}`},
		{0, `{"key":"lost-1","key":"other","outcome":"rerun"}`},
		{0, `{"KEY":"lost-1","Outcome":"rerun"}`},
		{0, `{"key":null,"outcome":"rerun"}`},
		{0, `{"key":1,"outcome":"rerun"}`},
		{0, `null`},
		{0, `[]`},
		{0, ``},
		{0, " \r\n\t"},
		{0, "\xef\xbb\xbf{\"key\":\"lost-1\",\"outcome\":\"rerun\"}"},
		{0, "{\"key\":\"\xff\",\"outcome\":\"rerun\"}"},
		{0, `{"key":"lost-1","outcome":"completed","note":"` + strings.Repeat("n", 1001) + `"}`},
		{0, strings.Repeat(`[`, 10001)},
		{1, `{"outcome":"delivered"}`},
		{1, `{"outcome":"retry"}`},
		{1, `{"outcome":"lost"}`},
		{1, `{}`},
		{2, ``},
		{2, `{}`},
		{2, `{"outcome":"retry"}`},
	} {
		f.Add(s.target, []byte(s.body))
	}
	// Past the limit: 413 before any JSON is read, not 400.
	f.Add(uint8(0), bytes.Repeat([]byte("x"), operate.MaxAdminBody+1))
	ctx := context.Background()
	db, err := schema.Open(ctx, filepath.Join(f.TempDir(), "admin.db"), &schema.Options{Durability: schema.DurabilityNormal})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	router := NewAdmin(db, &Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	now := time.Now().UnixMilli()
	const setup = `
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, attempts, created_at, completed_at, expires_at, result)
VALUES ('call_fuzz_done-1', 'local', 'done-1', 'meta', 'charge', 'hash', 'completed', 1, ?1, ?1, ?1 + 86400000, '{}')
ON CONFLICT DO NOTHING;
INSERT INTO effects (id, seq, destination, method, path, idempotency_key, next_attempt_at, created_at, updated_at)
VALUES (1, 1, 'payments', 'POST', '/v1/charges', 'fuzz-effect-1', ?1, ?1, ?1)
ON CONFLICT DO NOTHING;`
	if _, err := db.Write.ExecContext(ctx, setup, now); err != nil {
		f.Fatal(err)
	}
	var n int
	if err := db.Read.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM calls) + (SELECT count(*) FROM effects)`).Scan(&n); err != nil || n != 2 {
		f.Fatalf("fixture: %d rows, %v", n, err)
	}
	targets := []string{"/calls/resolve", "/effects/1/resolve", "/effects/1/retry"}
	f.Fuzz(func(t *testing.T, target uint8, body []byte) {
		// What every run starts from: call lost-1 and effect 1 unknown.
		_, err := db.Write.ExecContext(ctx, `
DELETE FROM calls WHERE principal = 'local' AND key = 'lost-1';
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, attempts, created_at, expires_at, on_lost)
VALUES ('call_fuzz_lost-1', 'local', 'lost-1', 'meta', 'charge', 'hash', 'unknown', 2, ?1, ?1 + 86400000, 'unknown');
UPDATE effects SET state = 'unknown', send_started_at = ?1, last_error = 'timed out' WHERE id = 1;`, now)
		if err != nil {
			t.Fatal(err)
		}
		path := targets[int(target)%len(targets)]
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080" // a client on this host
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, req)

		var m map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("POST %s %q: %d, not a JSON object: %q", path, body, rec.Code, rec.Body)
		}
		msg, _ := m["error"].(string)
		switch rec.Code {
		case http.StatusOK:
			if msg != "" {
				t.Fatalf("POST %s %q: 200 with error %q", path, body, msg)
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusRequestEntityTooLarge:
			if msg == "" {
				t.Fatalf("POST %s %q: %d without an error message: %v", path, body, rec.Code, m)
			}
		default:
			t.Fatalf("POST %s %q: status %d %v", path, body, rec.Code, m)
		}
		// A body past the limit is refused as too large before it is read
		// as JSON.
		tooLarge := len(body) > operate.MaxAdminBody && rec.Code == http.StatusRequestEntityTooLarge
		if !strictBody(body, path) && rec.Code != http.StatusBadRequest && !tooLarge {
			t.Fatalf("POST %s %q: %d, want 400 for a body that is not one object of the known fields", path, body, rec.Code)
		}
		if rec.Code != http.StatusOK {
			var callState, effectState string
			_ = db.Read.QueryRowContext(ctx, `SELECT state FROM calls WHERE key = 'lost-1'`).Scan(&callState)
			_ = db.Read.QueryRowContext(ctx, `SELECT state FROM effects WHERE id = 1`).Scan(&effectState)
			if callState != "unknown" || effectState != "unknown" {
				t.Fatalf("POST %s %q: refused with %d but call is %q, effect %q", path, body, rec.Code, callState, effectState)
			}
		}
	})
}

// strictBody reports whether body is what the API documents: empty, or one
// JSON value that decodes strictly into the endpoint's fields.
func strictBody(body []byte, path string) bool {
	if len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	var v any = &struct{}{}
	switch path {
	case "/calls/resolve":
		v = &struct {
			Principal, Key, CallID, Outcome, Note string
		}{}
	case "/effects/1/resolve":
		v = &struct{ Outcome string }{}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if dec.Decode(v) != nil {
		return false
	}
	_, err := dec.Token()
	return err == io.EOF
}
