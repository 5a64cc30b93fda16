package operator

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

func TestReadyz(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := schema.Open(ctx, filepath.Join(t.TempDir(), "ready.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d, err := outbox.NewDispatcher(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	router := NewHandler(db, &Options{Dispatcher: d})
	get := func() (int, map[string]any) {
		t.Helper()
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("readyz body %q: %v", rec.Body.String(), err)
		}
		return rec.Code, body
	}

	if code, body := get(); code != http.StatusServiceUnavailable {
		t.Errorf("before the dispatcher starts: %d %v, want 503", code, body)
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(dctx) }()
	stop := func() { cancel(); <-done }
	// Run marks itself running as its goroutine starts: poll for it.
	for deadline := time.Now().Add(10 * time.Second); !d.Running(); {
		if time.Now().After(deadline) {
			t.Fatal("dispatcher not running within 10s")
		}
		runtime.Gosched()
	}
	if code, body := get(); code != http.StatusOK || body["ready"] != true {
		t.Fatalf("running: %d %v, want 200", code, body)
	}

	// The database stops taking writes: not ready, and says why.
	if _, err := db.Write.Exec(`PRAGMA query_only = 1`); err != nil {
		t.Fatal(err)
	}
	code, body := get()
	checks, _ := body["checks"].(map[string]any)
	if code != http.StatusServiceUnavailable || checks["database"] == "ok" {
		t.Errorf("read-only database: %d %v, want 503 naming the database", code, body)
	}
	if _, err := db.Write.Exec(`PRAGMA query_only = 0`); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(); code != http.StatusOK {
		t.Errorf("writable again: %d, want 200", code)
	}

	stop()
	if code, body := get(); code != http.StatusServiceUnavailable {
		t.Errorf("dispatcher stopped: %d %v, want 503", code, body)
	}
}

// The handler serves the metrics, under the admin rule.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "m.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	metrics, _ := NewMetrics(db)
	router := NewHandler(db, &Options{Metrics: metrics})

	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080" // a client on this host
	rec := httptest.NewRecorder()
	router.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "go_goroutines ") {
		t.Fatalf("GET /metrics from loopback: %d %.200q", rec.Code, rec.Body.String())
	}
	remote := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	remote.RemoteAddr = "192.0.2.7:40000"
	rec = httptest.NewRecorder()
	router.ServeHTTP(rec, remote)
	if rec.Code != http.StatusForbidden {
		t.Errorf("GET /metrics from another host without an admin token: %d, want 403", rec.Code)
	}
}
