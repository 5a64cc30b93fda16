package outbox_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// twoProcesses is two layers on one SQLite file, each on its own handle as
// two processes would be: their writers are two connections, and one waits
// for the other's write lock under busy_timeout, then gets SQLITE_BUSY.
// Tool "hold" takes the writer with its first statement and keeps it until
// release is closed.
type twoProcesses struct {
	a, b     *mcp.ClientSession
	held     chan struct{} // closed once a handler holds the writer
	release  chan struct{}
	ran      atomic.Int64
	retrying chan struct{} // closed once b has retried a claim the writer refused
}

func newTwoProcesses(t *testing.T, busy, inFlightWait time.Duration) *twoProcesses {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shared.db")
	p := &twoProcesses{held: make(chan struct{}), release: make(chan struct{}), retrying: make(chan struct{})}
	var heldOnce, retryOnce sync.Once
	hold := func(ctx context.Context, tx outbox.Tx, req *mcp.CallToolRequest, in struct{ N int }) (*mcp.CallToolResult, struct{ N int }, error) {
		p.ran.Add(1)
		if _, err := tx.ExecContext(ctx, `INSERT INTO held (n) VALUES ($1)`, in.N); err != nil {
			return nil, in, err
		}
		heldOnce.Do(func() { close(p.held) })
		<-p.release
		return nil, in, nil
	}
	var sessions []*mcp.ClientSession
	for i, logger := range []*slog.Logger{nil, slog.New(&signalHandler{msg: "claim retried", fire: func() { retryOnce.Do(func() { close(p.retrying) }) }})} {
		db, err := schema.Open(ctx, path, &schema.Options{BusyTimeout: busy})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if i == 0 {
			if _, err := db.Write.Exec(`CREATE TABLE held (n INTEGER)`); err != nil {
				t.Fatal(err)
			}
		}
		l, err := outbox.New(db, &outbox.Options{InFlightWait: inFlightWait, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
		outbox.AddTool(l, s, &mcp.Tool{Name: "hold"}, hold, nil)
		sessions = append(sessions, connect(t, s))
	}
	p.a, p.b = sessions[0], sessions[1]
	t.Cleanup(func() {
		select {
		case <-p.release:
		default:
			close(p.release)
		}
	})
	return p
}

// holdInA starts a call of hold in a and returns once its handler holds
// the writer; the channel gets the call's result.
func (p *twoProcesses) holdInA(t *testing.T, key string) <-chan *mcp.CallToolResult {
	t.Helper()
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := callErr(context.Background(), p.a, "hold", key, map[string]any{"N": 1})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
		}
		done <- res
	}()
	select {
	case <-p.held:
	case res := <-done:
		t.Fatalf("the call in a ended before holding the writer: %s", text(res))
	}
	return done
}

// signalHandler calls fire for each debug record whose message contains msg.
type signalHandler struct {
	msg  string
	fire func()
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		h.fire()
	}
	return nil
}
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *signalHandler) WithGroup(string) slog.Handler      { return h }

// TestClaim_WriterBusyInAnotherProcess: a duplicate reaching process b while
// the original's handler in process a holds SQLite's write lock past
// busy_timeout waits the in-flight wait, not busy_timeout, and then gets an
// in_progress error saying so; a retry afterwards replays the original.
// Before, it got "could not record the call (begin: database is locked
// (5) (SQLITE_BUSY))" after busy_timeout.
func TestClaim_WriterBusyInAnotherProcess(t *testing.T) {
	sqliteOnly(t, "SQLITE_BUSY: another process holds the file's write lock")
	t.Parallel()
	const busy, wait = 100 * time.Millisecond, time.Second
	p := newTwoProcesses(t, busy, wait)
	first := p.holdInA(t, "k")

	start := time.Now()
	res := call(t, p.b, "hold", "k", map[string]any{"N": 1})
	took := time.Since(start)
	if !res.IsError || errorCode(res) != "in_progress" {
		t.Fatalf("duplicate in b while a holds the writer: isError %v, code %q, %q; want in_progress", res.IsError, errorCode(res), text(res))
	}
	for _, want := range []string{"another process holds the database", "nothing was executed", "Retry later", `"k"`} {
		if !strings.Contains(text(res), want) {
			t.Errorf("error %q does not say %q", text(res), want)
		}
	}
	if took < wait {
		t.Errorf("b answered after %v, before its in-flight wait of %v", took, wait)
	}

	close(p.release)
	if res := <-first; res.IsError {
		t.Fatalf("the original in a: %s", text(res))
	}
	res = call(t, p.b, "hold", "k", map[string]any{"N": 1})
	if res.IsError || callMeta(res)["replayed"] != true {
		t.Fatalf("retry in b after a committed: %s, want the replay", text(res))
	}
	if n := p.ran.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

// TestClaim_WriterBusyJoins: a duplicate in b that keeps finding the writer
// busy gets the original's result once a commits within the in-flight wait.
func TestClaim_WriterBusyJoins(t *testing.T) {
	sqliteOnly(t, "SQLITE_BUSY: another process holds the file's write lock")
	t.Parallel()
	p := newTwoProcesses(t, 50*time.Millisecond, time.Minute)
	first := p.holdInA(t, "k")

	second := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := callErr(context.Background(), p.b, "hold", "k", map[string]any{"N": 1})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
		}
		second <- res
	}()
	select {
	case <-p.retrying: // b found the writer busy and tries again
	case res := <-second:
		t.Fatalf("b answered while a held the writer: %s", text(res))
	}
	close(p.release)
	if res := <-first; res.IsError {
		t.Fatalf("the original in a: %s", text(res))
	}
	res := <-second
	if res.IsError || callMeta(res)["replayed"] != true {
		t.Fatalf("duplicate in b: %s, want the original's result, replayed", text(res))
	}
	if n := p.ran.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

// TestClaim_WriterBusyWaitBelowBusyTimeout: with an in-flight wait shorter
// than busy_timeout, the claim's wait for the other process's write lock
// ends with the in-flight wait, not with busy_timeout.
func TestClaim_WriterBusyWaitBelowBusyTimeout(t *testing.T) {
	sqliteOnly(t, "SQLITE_BUSY: another process holds the file's write lock")
	t.Parallel()
	const busy, wait = 4 * time.Second, 300 * time.Millisecond
	p := newTwoProcesses(t, busy, wait)
	p.holdInA(t, "k")

	start := time.Now()
	res := call(t, p.b, "hold", "other-key", map[string]any{"N": 2})
	took := time.Since(start)
	if !res.IsError || errorCode(res) != "in_progress" || !strings.Contains(text(res), "another process") {
		t.Fatalf("call in b while a holds the writer: isError %v, code %q, %q; want in_progress", res.IsError, errorCode(res), text(res))
	}
	if took < wait || took >= busy {
		t.Errorf("b answered after %v, want between its in-flight wait (%v) and busy_timeout (%v)", took, wait, busy)
	}
}

// TestClaim_FirstStatementBusyRetries: a call in b whose claim has
// committed reaches its handler's first statement while a's handler holds
// the file's write lock past b's busy_timeout. The statement waits for the
// lock, within the call's deadline, instead of failing the call with
// not_recorded; once a commits, b's call runs and is recorded, once.
func TestClaim_FirstStatementBusyRetries(t *testing.T) {
	sqliteOnly(t, "SQLITE_BUSY: another process holds the file's write lock")
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shared.db")
	entered, gate := make(chan struct{}), make(chan struct{})
	held, release := make(chan struct{}), make(chan struct{})
	retrying := make(chan struct{})
	var retryOnce, releaseOnce, gateOnce sync.Once
	var ran atomic.Int64
	hold := func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{ N int }) (*mcp.CallToolResult, struct{ N int }, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO held (n) VALUES ($1)`, in.N); err != nil {
			return nil, in, err
		}
		close(held)
		<-release
		return nil, in, nil
	}
	gated := func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{ N int }) (*mcp.CallToolResult, struct{ N int }, error) {
		ran.Add(1)
		close(entered)
		<-gate
		if _, err := tx.ExecContext(ctx, `INSERT INTO held (n) VALUES ($1)`, in.N); err != nil {
			return nil, in, err
		}
		return nil, in, nil
	}
	var sessions []*mcp.ClientSession
	for i, busy := range []time.Duration{5 * time.Second, 50 * time.Millisecond} {
		db, err := schema.Open(ctx, path, &schema.Options{BusyTimeout: busy})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		var logger *slog.Logger
		if i == 0 {
			if _, err := db.Write.Exec(`CREATE TABLE held (n INTEGER)`); err != nil {
				t.Fatal(err)
			}
		} else {
			logger = slog.New(&signalHandler{msg: "first statement retried", fire: func() { retryOnce.Do(func() { close(retrying) }) }})
		}
		l, err := outbox.New(db, &outbox.Options{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
		outbox.AddTool(l, s, &mcp.Tool{Name: "hold"}, hold, nil)
		outbox.AddTool(l, s, &mcp.Tool{Name: "gated"}, gated, nil)
		sessions = append(sessions, connect(t, s))
	}
	a, b := sessions[0], sessions[1]
	// On a failure, let the handlers end before the sessions close (cleanups
	// run last first), or the sessions' cleanup waits for ever.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }); gateOnce.Do(func() { close(gate) }) })

	second := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := callErr(ctx, b, "gated", "kb", map[string]any{"N": 2})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
		}
		second <- res
	}()
	<-entered // b's claim is made; its batch commits on its own (a waits for it)
	first := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := callErr(ctx, a, "hold", "ka", map[string]any{"N": 1})
		first <- res
	}()
	<-held // a's handler holds the write lock
	gateOnce.Do(func() { close(gate) })
	select {
	case <-retrying:
	case res := <-second:
		t.Fatalf("b answered while a held the write lock: %v %s", res.Meta, text(res))
	}
	releaseOnce.Do(func() { close(release) })
	if res := <-first; res == nil || res.IsError {
		t.Fatalf("the call in a: %v", res)
	}
	if res := <-second; res.IsError {
		t.Fatalf("the call in b: code %q, %s; want it run after a committed", errorCode(res), text(res))
	}
	if res := call(t, b, "gated", "kb", map[string]any{"N": 2}); res.IsError || callMeta(res)["replayed"] != true {
		t.Fatalf("retry in b: %s, want the replay", text(res))
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("b's handler ran %d times, want 1", n)
	}
}
