package operator

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The scrape carries the runtime's metrics next to the outbox's, and the
// outbox depth as the database holds it.
func TestMetricsHandler(t *testing.T) {
	t.Parallel()
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "m.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Write.Exec(`INSERT INTO effects (seq, destination, method, path, idempotency_key, state, next_attempt_at, created_at, updated_at)
		VALUES (1, 'payments', 'POST', '/v1/charges', 'k1', 'dead', 0, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	h, m := NewMetrics(db)
	if m == nil {
		t.Fatal("no outbox metrics")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Result().Body)
	for _, want := range []string{
		"go_goroutines ",
		`mcp_outbox_effects{destination="payments",state="dead"} 1`,
		`mcp_outbox_effects{destination="payments",state="pending"} 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("scrape lacks %q:\n%s", want, body)
		}
	}
}
