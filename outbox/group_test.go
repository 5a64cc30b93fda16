package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/query"
)

// steps is a test tool whose calls the test paces: each call, named by its
// argument, reports when its handler starts, waits for its "first" gate
// before its first statement (so its claim is done and it does not hold the
// writer), writes a row to notes, then waits for its "hold" gate while it
// holds the writer's turn.
type steps struct {
	mu    sync.Mutex
	ctl   map[string]*stepCtl
	layer *outbox.Layer
}

type stepCtl struct {
	started  chan struct{} // closed when the handler starts
	first    chan struct{} // closed by the test: go on to the first statement
	wrote    chan struct{} // closed after the first statement
	hold     chan struct{} // closed by the test: go on to return
	startOne sync.Once
	wroteOne sync.Once
}

type stepIn struct {
	Name string `json:"name"`
	// Fail makes the handler return an error after writing: a tool error.
	Fail bool `json:"fail,omitempty"`
	// Rollback writes with ON CONFLICT ROLLBACK a row that already exists,
	// which ends the whole shared transaction, not only the statement.
	Rollback string `json:"rollback,omitempty"`
}

type stepOut struct {
	Name string `json:"name"`
	Row  int64  `json:"row"`
}

func addSteps(t *testing.T, b *bundle) *steps {
	t.Helper()
	if _, err := b.db.Write.Exec(`CREATE TABLE notes (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)`); err != nil {
		t.Fatal(err)
	}
	s := &steps{ctl: map[string]*stepCtl{}, layer: b.layer}
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "step", Description: "test tool"},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in stepIn) (*mcp.CallToolResult, stepOut, error) {
			c := s.get(in.Name)
			c.startOne.Do(func() { close(c.started) })
			<-c.first
			var row int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO notes (name) VALUES ($1) RETURNING id`, in.Name).Scan(&row); err != nil {
				return nil, stepOut{}, err
			}
			if in.Rollback != "" {
				if _, err := tx.ExecContext(ctx, `INSERT OR ROLLBACK INTO notes (name) VALUES ($1)`, in.Rollback); err != nil {
					return nil, stepOut{}, err
				}
			}
			c.wroteOne.Do(func() { close(c.wrote) })
			<-c.hold
			if in.Fail {
				return nil, stepOut{}, outbox.Final(errors.New("refused after writing"))
			}
			return nil, stepOut{Name: in.Name, Row: row}, nil
		}, nil)
	return s
}

// get returns the gates of the call named name; they start open.
func (s *steps) get(name string) *stepCtl {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.ctl[name]
	if c == nil {
		c = &stepCtl{started: make(chan struct{}), first: make(chan struct{}), wrote: make(chan struct{}), hold: make(chan struct{})}
		close(c.first)
		close(c.hold)
		s.ctl[name] = c
	}
	return c
}

// gated returns the gates of name with both gates closed.
func (s *steps) gated(name string) *stepCtl {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &stepCtl{started: make(chan struct{}), first: make(chan struct{}), wrote: make(chan struct{}), hold: make(chan struct{})}
	s.ctl[name] = c
	return c
}

// call runs a step call in the background; its result arrives on the channel.
func (s *steps) call(t *testing.T, cs *mcp.ClientSession, key string, in stepIn) <-chan *mcp.CallToolResult {
	ch := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := callErr(context.Background(), cs, "step", key, in)
		if err != nil {
			t.Errorf("call %s: %v", key, err)
		}
		ch <- res
	}()
	return ch
}

// holdTurn starts a call named name that takes the writer's turn (it has
// written its first row) and holds it until release is called; its result
// then arrives on res.
func (s *steps) holdTurn(t *testing.T, cs *mcp.ClientSession, in stepIn) (res <-chan *mcp.CallToolResult, release func()) {
	t.Helper()
	c := s.gated(in.Name)
	close(c.first)
	res = s.call(t, cs, in.Name, in)
	<-c.wrote
	return res, func() { close(c.hold) }
}

// formBatch runs the scenario every test here builds on: "lead" takes the
// writer's turn and holds it; the others, claimed and parked before their
// first statement, are then let go, so they queue for the turn; when all
// are queued, in the order given, lead is released, and lead and the others
// end up in one batch (the layer's MaxBatchWait must allow it).
func (s *steps) formBatch(t *testing.T, cs *mcp.ClientSession, lead stepIn, others ...stepIn) map[string]*mcp.CallToolResult {
	t.Helper()
	results := map[string]<-chan *mcp.CallToolResult{}
	var gates []*stepCtl
	for _, in := range others {
		c := s.gated(in.Name)
		close(c.hold)
		gates = append(gates, c)
		results[in.Name] = s.call(t, cs, in.Name, in)
		<-c.started // claimed, not yet writing
	}
	leadRes, release := s.holdTurn(t, cs, lead)
	results[lead.Name] = leadRes
	// One at a time, so that they queue (and later run) in the order given.
	for i, c := range gates {
		close(c.first)
		waitFor(t, func() bool { return outbox.WaitingForTurn(s.layer) == i+1 })
	}
	release()
	got := map[string]*mcp.CallToolResult{}
	for name, ch := range results {
		got[name] = <-ch
	}
	return got
}

func notes(t *testing.T, b *bundle) map[string]bool {
	t.Helper()
	rows, err := b.db.Read.Query(`SELECT name FROM notes`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		got[n] = true
	}
	return got
}

func callState(t *testing.T, b *bundle, key string) string {
	t.Helper()
	var state string
	if err := b.db.Read.QueryRow(`SELECT state FROM calls WHERE key = $1`, key).Scan(&state); err != nil {
		t.Fatalf("call %s: %v", key, err)
	}
	return state
}

// A batch holds several calls; one of them fails after writing. Its writes
// are rolled back and its failure recorded, while the others' writes and
// results commit, all in one commit.
func TestGroupCommit_FailingHandlerInBatch(t *testing.T) {
	sqliteOnly(t, "group commit: SQLite's one writer shares its transactions among calls; on PostgreSQL each unit has its own")
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, &outbox.Options{MaxBatchWait: time.Hour, Metrics: outbox.NewMetrics(reg)}, nil)
	s := addSteps(t, b)
	got := s.formBatch(t, b.session, stepIn{Name: "a"}, stepIn{Name: "b", Fail: true}, stepIn{Name: "c"}, stepIn{Name: "d"})

	if n, sum := histogram(t, reg, "mcp_outbox_commit_batch_size", map[string]string{"kind": "calls"}); n != 1 || sum != 4 {
		t.Fatalf("commits of calls: %d holding %v calls, want one commit of 4", n, sum)
	}
	for _, name := range []string{"a", "c", "d"} {
		if res := got[name]; res == nil || res.IsError {
			t.Fatalf("call %s: %+v", name, res)
		}
		if st := callState(t, b, name); st != "completed" {
			t.Errorf("call %s is %s, want completed", name, st)
		}
	}
	if res := got["b"]; res == nil || !res.IsError {
		t.Fatalf("call b: %+v, want a tool error", res)
	}
	if st := callState(t, b, "b"); st != "failed" {
		t.Errorf("call b is %s, want failed", st)
	}
	if want := map[string]bool{"a": true, "c": true, "d": true}; !equalSets(notes(t, b), want) {
		t.Errorf("notes = %v, want %v: the failed call's write must be rolled back, and only it", notes(t, b), want)
	}
	// The recorded failure replays; nothing runs again.
	res := call(t, b.session, "step", "b", stepIn{Name: "b", Fail: true})
	if !res.IsError || callMeta(res)["replayed"] != true {
		t.Errorf("retry of b: %+v, want the replayed failure", res)
	}
	if len(notes(t, b)) != 3 {
		t.Errorf("notes after retry = %v", notes(t, b))
	}
}

// With MaxBatchCalls 1, the same scenario commits each call on its own.
func TestGroupCommit_MaxBatchCalls(t *testing.T) {
	sqliteOnly(t, "group commit: SQLite's one writer shares its transactions among calls; on PostgreSQL each unit has its own")
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, &outbox.Options{MaxBatchCalls: 1, MaxBatchWait: time.Hour, Metrics: outbox.NewMetrics(reg)}, nil)
	s := addSteps(t, b)
	s.formBatch(t, b.session, stepIn{Name: "a"}, stepIn{Name: "b"}, stepIn{Name: "c"})
	if n, sum := histogram(t, reg, "mcp_outbox_commit_batch_size", map[string]string{"kind": "calls"}); n != 3 || sum != 3 {
		t.Fatalf("commits of calls: %d holding %v calls, want 3 of one", n, sum)
	}
	if len(notes(t, b)) != 3 {
		t.Errorf("notes = %v", notes(t, b))
	}
}

// Two calls with the same key while a batch forms: the duplicate waits for
// the original, whose outcome commits in the batch, and then gets that
// outcome; the handler runs once.
func TestGroupCommit_DuplicatesInOneBatch(t *testing.T) {
	sqliteOnly(t, "group commit: SQLite's one writer shares its transactions among calls; on PostgreSQL each unit has its own")
	t.Parallel()
	b := setup(t, &outbox.Options{MaxBatchWait: time.Hour}, nil)
	s := addSteps(t, b)
	leadRes, release := s.holdTurn(t, b.session, stepIn{Name: "lead"})

	orig := s.gated("dup")
	close(orig.hold)
	origRes := s.call(t, b.session, "dup", stepIn{Name: "dup"})
	// The call's claim waits for the turn lead holds, and a second
	// connection sends the same call; whichever claims the key first runs,
	// the other waits for it.
	dupRes := s.call(t, connect(t, b.server), "dup", stepIn{Name: "dup"})
	waitFor(t, func() bool { return outbox.WaitingForTurn(b.layer) == 1 && waitingOnOriginal() >= 1 })
	close(orig.first)
	release()

	r1, r2, r0 := <-origRes, <-dupRes, <-leadRes
	for _, r := range []*mcp.CallToolResult{r0, r1, r2} {
		if r == nil || r.IsError {
			t.Fatalf("result %+v", r)
		}
	}
	a, _ := structuredAndNote(t, r1)
	c, _ := structuredAndNote(t, r2)
	if a != c {
		t.Errorf("duplicate got %s, original %s", c, a)
	}
	// Either call may have claimed the key first; the other is the replay.
	if (callMeta(r1)["replayed"] == true) == (callMeta(r2)["replayed"] == true) {
		t.Errorf("want exactly one of the two answered as a replay: %v, %v", callMeta(r1), callMeta(r2))
	}
	if got := notes(t, b); len(got) != 2 {
		t.Errorf("notes = %v, want lead and dup once each", got)
	}
}

// A statement with ON CONFLICT ROLLBACK ends the whole shared transaction,
// taking the work of calls already in the batch with it. The batch must
// then fail as a whole: no call of it is recorded as done, and each one runs
// on retry. Calls queued behind it start a new batch and commit.
func TestGroupCommit_BrokenBatchFailsWhole(t *testing.T) {
	sqliteOnly(t, "group commit: SQLite's one writer shares its transactions among calls; on PostgreSQL each unit has its own")
	t.Parallel()
	b := setup(t, &outbox.Options{MaxBatchWait: time.Hour}, nil)
	s := addSteps(t, b)
	got := s.formBatch(t, b.session, stepIn{Name: "a"}, stepIn{Name: "b", Rollback: "a"}, stepIn{Name: "c"})

	for _, name := range []string{"a", "b"} {
		if res := got[name]; res == nil || !res.IsError || errorCode(res) != "not_recorded" {
			t.Fatalf("call %s: %+v, want not_recorded", name, res)
		}
		if n := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE key = $1 AND state != 'in_flight'`, name); n != 0 {
			t.Errorf("call %s has a recorded outcome", name)
		}
	}
	if res := got["c"]; res == nil || res.IsError {
		t.Fatalf("call c: %+v %s", res, text(res))
	}
	if want := map[string]bool{"c": true}; !equalSets(notes(t, b), want) {
		t.Fatalf("notes = %v, want %v", notes(t, b), want)
	}
	if res := call(t, b.session, "step", "a", stepIn{Name: "a"}); res.IsError || callMeta(res)["replayed"] == true {
		t.Fatalf("retry of a: %+v, want it run", res)
	}
	if !notes(t, b)["a"] {
		t.Errorf("retry of a did not write")
	}
}

func equalSets(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// A call whose claim is not committed yet (it waits for the writer's turn,
// or rides in an open batch) has no row a reader could see; the status tool
// still answers in_flight for it, from the attempts of this process.
func TestGroupCommit_StatusOfUncommittedClaim(t *testing.T) {
	sqliteOnly(t, "group commit: SQLite's one writer shares its transactions among calls; on PostgreSQL each unit has its own")
	t.Parallel()
	b := setup(t, &outbox.Options{MaxBatchWait: time.Hour}, nil)
	s := addSteps(t, b)
	leadRes, release := s.holdTurn(t, b.session, stepIn{Name: "lead"})
	res := s.call(t, b.session, "x", stepIn{Name: "x"})
	waitFor(t, func() bool { return outbox.WaitingForTurn(b.layer) == 1 })
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE key = 'x'`); n != 0 {
		t.Fatalf("x has %d rows before its claim commits", n)
	}
	if st := status(t, b.session, map[string]any{"key": "x"}); st.State != query.InFlight || st.Tool != "step" || st.KeySource != "meta" {
		t.Errorf("status of a call whose claim is not committed: %+v, want in_flight", st)
	}
	release()
	<-leadRes
	<-res
	if st := status(t, b.session, map[string]any{"key": "x"}); st.State != query.Completed {
		t.Errorf("status after the commit: %+v", st)
	}
}
