package operator

import (
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// TestAdminFaults: with the database write-locked by another connection,
// the admin API and the page answer a write in the layer's words with an
// error id and no driver text, the API with 503 and Retry-After, as an
// outage to wait out; the log has the driver's error under the
// same id (issue 37, point 6). A refusal of the layer's own (no such
// effect) still says why.
func TestAdminFaults(t *testing.T) {
	t.Parallel()
	db, lock := openLockableDB(t)
	insertEffect(t, db, "payments", "dead")
	insertEffect(t, db, "mail", "pending")
	var id string
	if err := db.Read.QueryRow(`SELECT id FROM effects WHERE destination = 'payments'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	opts := &Options{Logger: slog.New(slog.NewTextHandler(logs, nil))}
	adminH := NewAdmin(db, opts)
	page, err := NewPage(context.Background(), db, opts)
	if err != nil {
		t.Fatal(err)
	}

	rec := adminPost(adminH, "/effects/999999/retry", "")
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "999999") {
		t.Errorf("no such effect: %d %s, want 404 naming it", rec.Code, rec.Body)
	}

	lock(t)
	// driverText is what SQLite's and PostgreSQL's drivers say of a lock.
	driverText := regexp.MustCompile(`(?i)sqlite|locked|busy|sqlstate|lock timeout|canceling statement`)
	idIn := regexp.MustCompile(`error id ([0-9a-f]{8})\b`)
	checkLogged := func(t *testing.T, id string) {
		t.Helper()
		line := grepLines(logs.String(), "error_id="+id)
		if line == "" || !strings.Contains(line, "level=ERROR") || !driverText.MatchString(line) {
			t.Errorf("log for error id %s: %q, want an ERROR line with the driver's text; log:\n%s", id, line, logs)
		}
	}
	for _, c := range []struct{ path, body string }{
		{"/effects/retry-dead", ""},
		{"/effects/cancel-pending", `{"destination": "mail"}`},
		{"/effects/" + id + "/cancel", ""},
	} {
		t.Run("Admin"+c.path, func(t *testing.T) {
			rec := adminPost(adminH, c.path, c.body)
			var body struct{ Error, ErrorID string }
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || driverText.MatchString(rec.Body.String()) {
				t.Fatalf("POST %s: %d %v %s, want 503 with Retry-After (the database is held, not broken) without the driver's text",
					c.path, rec.Code, rec.Header(), rec.Body)
			}
			m := idIn.FindStringSubmatch(body.Error)
			if m == nil || body.ErrorID != m[1] {
				t.Fatalf("POST %s: %s, want an error id in error and errorId", c.path, rec.Body)
			}
			checkLogged(t, body.ErrorID)
		})
	}
	t.Run("PageFlash", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodPost, "/effects/retry-dead", strings.NewReader(""))
		req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rec := httptest.NewRecorder()
		page.ServeHTTP(rec, req)
		loc, err := url.Parse(rec.Header().Get("Location"))
		if err != nil || rec.Code != http.StatusSeeOther {
			t.Fatalf("page retry-dead: %d, Location %q", rec.Code, rec.Header().Get("Location"))
		}
		msg := loc.Query().Get("failed")
		m := idIn.FindStringSubmatch(msg)
		if m == nil || driverText.MatchString(msg) {
			t.Fatalf("flash %q: want an error id and no driver text", msg)
		}
		checkLogged(t, m[1])
	})
}

// adminPost POSTs body to path of h as a client on this host.
func adminPost(h http.Handler, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// openLockableDB opens a test database whose writes give up quickly on a
// lock, and a function that takes its write lock from another connection
// until the test ends: BEGIN IMMEDIATE on SQLite, an exclusive lock on
// the effects table on PostgreSQL (with lock_timeout on the database's
// own connections).
func openLockableDB(t *testing.T) (*schema.DB, func(*testing.T)) {
	t.Helper()
	ctx := context.Background()
	target := filepath.Join(t.TempDir(), "operator.db")
	postgres := os.Getenv("MCP_OUTBOX_TEST_STORE") == "postgres"
	open := target
	if postgres {
		target = pgtest.Database(t)
		sep := "?"
		if strings.Contains(target, "?") {
			sep = "&"
		}
		open = target + sep + "lock_timeout=200"
	}
	db, err := schema.Open(ctx, open, &schema.Options{BusyTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	lock := func(t *testing.T) {
		t.Helper()
		driver, begin := "sqlite", "BEGIN IMMEDIATE"
		if postgres {
			driver, begin = "pgx", "BEGIN; LOCK TABLE effects IN ACCESS EXCLUSIVE MODE"
		}
		other, err := sql.Open(driver, target)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := other.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, begin); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			conn.ExecContext(ctx, "ROLLBACK")
			conn.Close()
			other.Close()
		})
	}
	return db, lock
}

// TestAdminFaultBroken: a fault that waiting will not mend (here the
// effects table is gone) is a 500 with an error id and no Retry-After,
// where a held database is a 503 (TestAdminFaults).
func TestAdminFaultBroken(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	if _, err := db.Write.Exec(`ALTER TABLE effects RENAME TO effects_gone`); err != nil {
		t.Fatal(err)
	}
	rec := adminPost(NewAdmin(db, &Options{Logger: slog.New(slog.DiscardHandler)}), "/effects/retry-dead", "")
	var body struct{ Error, ErrorID string }
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if rec.Code != http.StatusInternalServerError || rec.Header().Get("Retry-After") != "" || body.ErrorID == "" ||
		strings.Contains(rec.Body.String(), "effects") {
		t.Fatalf("retry-dead without an effects table: %d %v %s, want 500 with an error id, no Retry-After, no driver text",
			rec.Code, rec.Header(), rec.Body)
	}
}
