package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// lockedBuffer is a log destination that handlers may write to from
// several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestMain stops the PostgreSQL server the tests started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// openTestDB opens a database on the store MCP_OUTBOX_TEST_STORE names:
// SQLite by default, PostgreSQL with "postgres".
func openTestDB(t testing.TB) *schema.DB {
	t.Helper()
	target := filepath.Join(t.TempDir(), "operator.db")
	if os.Getenv("MCP_OUTBOX_TEST_STORE") == "postgres" {
		target = pgtest.Database(t)
	}
	db, err := schema.Open(context.Background(), target, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// getJSON GETs path from h as a client on this host.
func getJSON(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("GET %s: body %q: %v", path, rec.Body.String(), err)
	}
	return rec.Code, body
}

// TestReadyz turns an SQLite database read-only, which has no PostgreSQL
// counterpart here.
func TestReadyz(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := schema.Open(ctx, filepath.Join(t.TempDir(), "ready.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	d, err := dispatch.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	health := NewHealth(db, &Options{Dispatcher: d, BasePath: "/ops/", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	get := func() (int, map[string]any) { t.Helper(); return getJSON(t, health, "/ops/readyz") }

	if code, body := get(); code != http.StatusServiceUnavailable || body["status"] != "unavailable" {
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
	if code, body := get(); code != http.StatusOK || body["ready"] != true || body["status"] != "ok" {
		t.Fatalf("running: %d %v, want 200 ok", code, body)
	}

	// The database stops taking writes: not ready, and says so without
	// the driver's text, which goes to the log.
	if _, err := db.Write.Exec(`PRAGMA query_only = 1`); err != nil {
		t.Fatal(err)
	}
	code, body := get()
	checks, _ := body["checks"].(map[string]any)
	if code != http.StatusServiceUnavailable || checks["database"] != "not ready: see the server's log" {
		t.Errorf("read-only database: %d %v, want 503 with a generic reason", code, body)
	}
	if !strings.Contains(logs.String(), "readonly") {
		t.Errorf("the log lacks the database's error:\n%s", logs.String())
	}
	if _, err := db.Write.Exec(`PRAGMA query_only = 0`); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(); code != http.StatusOK {
		t.Errorf("writable again: %d, want 200", code)
	}
	if rec := httptest.NewRecorder(); true {
		health.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ops/healthz", nil))
		if rec.Code != http.StatusOK || rec.Body.String() != "ok\n" {
			t.Errorf("healthz: %d %q", rec.Code, rec.Body.String())
		}
	}

	stop()
	if code, body := get(); code != http.StatusServiceUnavailable {
		t.Errorf("dispatcher stopped: %d %v, want 503", code, body)
	}
}

// runningDispatcher is a Dispatcher that runs and knows a fixed set.
type runningDispatcher []string

func (runningDispatcher) Running() bool            { return true }
func (d runningDispatcher) Destinations() []string { return d }

func insertEffect(t *testing.T, db *schema.DB, dest, state string) {
	t.Helper()
	if _, err := db.Write.Exec(`INSERT INTO effects (seq, destination, method, path, idempotency_key, state, next_attempt_at, created_at, updated_at)
		VALUES (1, $1, 'POST', '/v1/charges', $2, $3, 0, 0, 0)`, dest, dest+"-"+state+"-"+time.Now().String(), state); err != nil {
		t.Fatal(err)
	}
}

// An effect pending for a destination the dispatcher does not know is
// named by the readiness check (degraded, still 200), counted in the
// metrics, and shown on the page; one the dispatcher knows is not.
func TestUnconfiguredDestination(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	opts := &Options{Dispatcher: runningDispatcher{"payments"}}
	health := NewHealth(db, opts)
	metrics := NewMetricsHandler(db, opts)
	page, err := NewPage(context.Background(), db, opts)
	if err != nil {
		t.Fatal(err)
	}
	insertEffect(t, db, "payments", "pending")
	insertEffect(t, db, "paymnets", "dead") // not pending: nothing waits for it
	if code, body := getJSON(t, health, "/readyz"); code != http.StatusOK || body["status"] != "ok" {
		t.Errorf("only known destinations pending: %d %v, want 200 ok", code, body)
	}

	insertEffect(t, db, "paymnets", "pending")
	insertEffect(t, db, "paymnets", "pending")
	code, body := getJSON(t, health, "/readyz")
	checks, _ := body["checks"].(map[string]any)
	if code != http.StatusOK || body["status"] != "degraded" || body["ready"] != true ||
		checks["destinations"] != "effects pending for destinations this dispatcher does not know: paymnets" {
		t.Errorf("pending for an unknown destination: %d %v, want 200 degraded naming paymnets", code, body)
	}

	scrape := get(t, metrics, "/metrics")
	if !strings.Contains(scrape, `mcp_outbox_effects_unconfigured{destination="paymnets"} 2`) ||
		strings.Contains(scrape, `mcp_outbox_effects_unconfigured{destination="payments"}`) {
		t.Errorf("metrics: want 2 unconfigured for paymnets alone:\n%s", grepLines(scrape, "unconfigured"))
	}

	html := get(t, page, "/")
	if !strings.Contains(html, `id="unconfigured"`) || !strings.Contains(html, "<code>paymnets</code> (2 pending)") ||
		strings.Count(html, "not configured here") != 1 {
		t.Errorf("page does not name paymnets as unconfigured (once):\n%s", grepLines(html, "paymnets"))
	}

	// A process that delivers to no destination at all (mcp-outbox serve
	// without --dest) says so, rather than blaming a dispatcher.
	code, body = getJSON(t, NewHealth(db, &Options{Dispatcher: runningDispatcher{}}), "/readyz")
	checks, _ = body["checks"].(map[string]any)
	if code != http.StatusOK || body["status"] != "degraded" ||
		checks["destinations"] != "effects pending, and this process delivers to no destination: payments, paymnets" {
		t.Errorf("no destinations at all: %d %v, want 200 degraded saying nothing here delivers", code, body)
	}

	// Without a dispatcher there is no set to compare with.
	if code, body := getJSON(t, NewHealth(db, nil), "/readyz"); code != http.StatusOK || body["status"] != "ok" {
		t.Errorf("no dispatcher: %d %v, want 200 ok", code, body)
	}
}

// get GETs path from h as a client on this host and returns the body.
func get(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, rec.Code, b)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// readyState GETs /readyz and returns its status code, status and the
// dispatcher's and destinations' checks.
func readyState(t *testing.T, h http.Handler) string {
	t.Helper()
	code, body := getJSON(t, h, "/readyz")
	checks, _ := body["checks"].(map[string]any)
	return fmt.Sprintf("%d %v ready=%v dispatcher=%v destinations=%v", code, body["status"], body["ready"], checks["dispatcher"], checks["destinations"])
}

// A layer whose Start was forgotten serves calls and keeps their effects,
// but nothing delivers them: with Options.Layer, readiness says so,
// degraded (still 200: taking the process out of a load balancer would
// deliver nothing more), until Start. The checks of the Runner then come
// from the layer without passing it; a Runner stopped is unavailable.
func TestReadyz_LayerNotStarted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openTestDB(t)
	layer, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	health := NewHealth(db, &Options{Layer: layer})
	notStartedState := "200 degraded ready=true dispatcher=" + notStarted + " destinations=" + destinationsUnchecked
	if got := readyState(t, health); got != notStartedState {
		t.Errorf("never started:\n got %s\nwant %s", got, notStartedState)
	}
	// A typo'd destination enqueued before any Start is not vouched for.
	insertEffect(t, db, "mailr", "pending")
	if got := readyState(t, health); got != notStartedState {
		t.Errorf("never started, an effect pending for a name nothing checked:\n got %s\nwant %s", got, notStartedState)
	}
	if _, err := db.Write.Exec(`DELETE FROM effects WHERE destination = 'mailr'`); err != nil {
		t.Fatal(err) // else Start would refuse, rightly
	}
	if got := readyState(t, NewHealth(db, nil)); got != "200 ok ready=true dispatcher=ok destinations=<nil>" {
		t.Errorf("without Options.Layer (cannot tell): %s", got)
	}
	if got := readyState(t, NewHealth(db, &Options{Layer: layer, Dispatcher: runningDispatcher{"payments"}})); got != "200 ok ready=true dispatcher=ok destinations=ok" {
		t.Errorf("with a dispatcher of its own: %s, want ok", got)
	}
	noURL := &outbox.StartOptions{Dispatcher: &dispatch.Options{Destinations: []dispatch.Destination{{Name: "x"}}}}
	if _, err := layer.Start(ctx, noURL); err == nil {
		t.Fatal("a bad Start started")
	}
	if got := readyState(t, health); got != notStartedState {
		t.Errorf("after a failed Start: %s, want still not started", got)
	}

	quiet := &outbox.StartOptions{ReapInterval: outbox.ReaperOff, TaskScanInterval: -1}
	elsewhere := *quiet
	elsewhere.NoDispatcher = true
	r, err := layer.Start(ctx, &elsewhere)
	if err != nil {
		t.Fatal(err)
	}
	if got := readyState(t, health); got != "200 ok ready=true dispatcher=ok destinations=ok" {
		t.Errorf("started with NoDispatcher: %s, want ok", got)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readyState(t, health); !strings.HasPrefix(got, "503 unavailable ready=false dispatcher=not running") {
		t.Errorf("stopped: %s, want 503 not running", got)
	}

	u, _ := url.Parse("http://127.0.0.1:1")
	delivering := *quiet
	delivering.Dispatcher = &dispatch.Options{Destinations: []dispatch.Destination{{Name: "payments", URL: u}}}
	r, err = layer.Start(ctx, &delivering)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(context.Background()) })
	for deadline := time.Now().Add(10 * time.Second); !r.Running(); {
		if time.Now().After(deadline) {
			t.Fatal("dispatcher not running within 10s")
		}
		runtime.Gosched()
	}
	if got := readyState(t, health); got != "200 ok ready=true dispatcher=ok destinations=ok" {
		t.Errorf("started with a dispatcher: %s, want ok", got)
	}
	insertEffect(t, db, "paymnets", "pending")
	if got := readyState(t, health); got != "200 degraded ready=true dispatcher=ok destinations=effects pending for destinations this dispatcher does not know: paymnets" {
		t.Errorf("pending for a name the layer's dispatcher does not know: %s", got)
	}
}
