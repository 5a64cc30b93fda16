package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestReadyz(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := testEnv(nil, nil, io.Discard, io.Discard)
	a, err := openApp(ctx, env, &appConfig{db: filepath.Join(t.TempDir(), "ready.db"), durability: "full", logLevel: "error"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	router := newRouter(a, a.logger)
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
	stop, err := a.startDispatcher(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Run marks itself running as its goroutine starts: poll for it.
	for deadline := time.Now().Add(10 * time.Second); !a.dispatcher.Running(); {
		if time.Now().After(deadline) {
			t.Fatal("dispatcher not running within 10s")
		}
		runtime.Gosched()
	}
	if code, body := get(); code != http.StatusOK || body["ready"] != true {
		t.Fatalf("running: %d %v, want 200", code, body)
	}

	// The database stops taking writes: not ready, and says why.
	if _, err := a.db.Write.Exec(`PRAGMA query_only = 1`); err != nil {
		t.Fatal(err)
	}
	code, body := get()
	checks, _ := body["checks"].(map[string]any)
	if code != http.StatusServiceUnavailable || checks["database"] == "ok" {
		t.Errorf("read-only database: %d %v, want 503 naming the database", code, body)
	}
	if _, err := a.db.Write.Exec(`PRAGMA query_only = 0`); err != nil {
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

// serve's router serves the metrics, under the admin rule.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	env := testEnv(nil, nil, io.Discard, io.Discard)
	a, err := openApp(context.Background(), env, &appConfig{db: filepath.Join(t.TempDir(), "m.db"), durability: "full", logLevel: "error"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	router := newRouter(a, a.logger)

	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	fromLoopback(req)
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
