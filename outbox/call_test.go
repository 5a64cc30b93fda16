package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

func call(t *testing.T, cs *mcp.ClientSession, name, key string, args any) *mcp.CallToolResult {
	t.Helper()
	return outboxtest.Call(t, cs, name, key, args)
}

func callErr(ctx context.Context, cs *mcp.ClientSession, name, key string, args any) (*mcp.CallToolResult, error) {
	return outboxtest.CallErr(ctx, cs, name, key, args)
}

func callCharge(t *testing.T, cs *mcp.ClientSession, key string, amount int) *mcp.CallToolResult {
	t.Helper()
	return outboxtest.CallCharge(t, cs, key, amount)
}

func callMeta(res *mcp.CallToolResult) map[string]any { return outboxtest.CallMeta(res) }

func errorCode(res *mcp.CallToolResult) string {
	s, _ := res.Meta[outbox.MetaKeyError].(string)
	return s
}

func text(res *mcp.CallToolResult) string { return outboxtest.Text(res) }

func chargeID(t *testing.T, res *mcp.CallToolResult) int64 {
	t.Helper()
	b, _ := json.Marshal(res.StructuredContent)
	var out ledger.ChargeOut
	if err := json.Unmarshal(b, &out); err != nil || out.ChargeID == 0 {
		t.Fatalf("no charge_id in %s (%v)", b, text(res))
	}
	return out.ChargeID
}

func TestCall_Replay(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"k1", ""} {
		t.Run("key="+key, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, nil)
			first := callCharge(t, b.session, key, 100)
			if first.IsError {
				t.Fatalf("first call failed: %s", text(first))
			}
			second := callCharge(t, b.session, key, 100)
			if got := charges(t, b); got != 1 {
				t.Fatalf("charges = %d, want 1", got)
			}
			if got, want := chargeID(t, second), chargeID(t, first); got != want {
				t.Errorf("replayed charge_id = %d, want %d", got, want)
			}
			if m := callMeta(second); m["replayed"] != true || m["joined"] != false {
				t.Errorf("second result meta = %v, want replayed, not joined", second.Meta)
			}
			if m := callMeta(first); m["replayed"] != false || m["key"] == "" {
				t.Errorf("first result meta = %v, want not replayed, with key", first.Meta)
			}
			if !strings.Contains(text(second), "did not run again") {
				t.Errorf("replay is not visible to the model: %q", text(second))
			}
			wantSource := "meta"
			if key == "" {
				wantSource = "fingerprint"
			}
			if got := callMeta(second)["keySource"]; got != wantSource {
				t.Errorf("keySource = %v, want %s", got, wantSource)
			}
			// A new connection is a new session with JSON-RPC ids from 1:
			// the key still finds the call.
			third := callCharge(t, connect(t, b.server), key, 100)
			if callMeta(third)["replayed"] != true || charges(t, b) != 1 {
				t.Errorf("call on a new connection was not replayed: %s", text(third))
			}
		})
	}
}

func TestCall_KeyConflict(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	callCharge(t, b.session, "order-7", 100)
	res := callCharge(t, b.session, "order-7", 250)
	if !res.IsError || errorCode(res) != "key_conflict" {
		t.Fatalf("want key_conflict error, got %v %s", res.Meta, text(res))
	}
	if !strings.Contains(text(res), `"order-7"`) {
		t.Errorf("error does not name the key: %s", text(res))
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	// Same key on another tool is a conflict too.
	res = call(t, b.session, "refund", "order-7", map[string]any{"charge_id": 1})
	if errorCode(res) != "key_conflict" {
		t.Errorf("key reused on another tool: got %s", text(res))
	}
}

func TestCall_ConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	g := addGate(b.layer, b.server)
	const n = 8
	results := make([]*mcp.CallToolResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// Separate connections, as retries from a restarted client would be.
			cs := b.session
			if i%2 == 1 {
				cs = connect(t, b.server)
			}
			res, err := callErr(context.Background(), cs, "gate", "dup", map[string]any{"n": 5})
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = res
		})
	}
	<-g.started // the first attempt is running; the others must wait for it
	close(g.release)
	wg.Wait()
	if got := g.runs.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	if got := charges(t, b); got != 1 {
		t.Fatalf("charges = %d, want 1", got)
	}
	want, _ := structuredAndNote(t, results[0])
	replays := 0
	for i, r := range results {
		if r == nil || r.IsError {
			t.Fatalf("caller %d: %v", i, r)
		}
		got, note := structuredAndNote(t, r)
		if got != want {
			t.Errorf("caller %d got %s, want %s", i, got, want)
		}
		if callMeta(r)["replayed"] == true {
			replays++
			if !strings.HasPrefix(note, "[mcp-outbox] ") {
				t.Errorf("caller %d: a replay whose structured content has the note %q", i, note)
			}
		} else if note != "" {
			t.Errorf("caller %d: the call that ran has the note %q", i, note)
		}
	}
	if replays != n-1 {
		t.Errorf("replays = %d, want %d", replays, n-1)
	}
}

func TestCall_InFlightWaitBound(t *testing.T) {
	t.Parallel()
	b := setup(t, &outbox.Options{InFlightWait: 50 * time.Millisecond}, nil)
	g := addGate(b.layer, b.server)
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := callErr(context.Background(), b.session, "gate", "slow", map[string]any{"n": 1})
		done <- res
	}()
	<-g.started
	res := call(t, connect(t, b.server), "gate", "slow", map[string]any{"n": 1})
	if errorCode(res) != "in_progress" || !strings.Contains(text(res), outbox.StatusToolName) || !strings.Contains(text(res), `"slow"`) {
		t.Fatalf("want in_progress error naming key and status tool, got %v %s", res.Meta, text(res))
	}
	close(g.release)
	if r := <-done; r == nil || r.IsError {
		t.Fatalf("original call: %v", r)
	}
	if got := g.runs.Load(); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
}

func TestCall_CancelBeforeCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	g := addGate(b.layer, b.server)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := callErr(ctx, b.session, "gate", "c1", map[string]any{"n": 1})
		errc <- err
	}()
	<-g.started
	cancel() // the client sends notifications/cancelled
	if err := <-errc; err == nil {
		t.Fatal("cancelled call returned no error")
	}
	// The abandoned attempt deletes its claim; nothing else was written.
	waitFor(t, func() bool { return count(t, b.db.Read, `SELECT count(*) FROM calls`) == 0 })
	if got := charges(t, b); got != 0 {
		t.Fatalf("charges after cancel = %d, want 0", got)
	}
	close(g.release)
	res := call(t, b.session, "gate", "c1", map[string]any{"n": 1})
	if res.IsError || callMeta(res)["replayed"] != false {
		t.Fatalf("retry after cancel: %v %s", res.Meta, text(res))
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// A cancel that arrives after the commit does not undo the call, and the
// "context canceled" result the SDK sends is not what a retry gets.
func TestCall_CancelAfterCommit(t *testing.T) {
	b := setup(t, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	outbox.SetTestHookAfterCommit(func(serverCtx context.Context) {
		cancel()
		<-serverCtx.Done() // the cancellation has reached the handler's context
	})
	defer outbox.SetTestHookAfterCommit(nil)
	_, err := callErr(ctx, b.session, "charge", "late", map[string]any{"amount": 7})
	if err == nil {
		t.Fatal("want the cancelled call to return an error to the client")
	}
	outbox.SetTestHookAfterCommit(nil)
	res := callCharge(t, b.session, "late", 7)
	if res.IsError || callMeta(res)["replayed"] != true {
		t.Fatalf("retry after late cancel = %v %s, want replay of the committed charge", res.Meta, text(res))
	}
	if got := charges(t, b); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

func TestCall_HandlerError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	res := call(t, b.session, "refund", "r1", map[string]any{"charge_id": 42})
	if !res.IsError || !strings.Contains(text(res), "no charge with id 42") {
		t.Fatalf("refund of a missing charge: %s", text(res))
	}
	if got := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE state = 'failed'`); got != 1 {
		t.Fatalf("failed calls = %d, want 1", got)
	}
	again := call(t, b.session, "refund", "r1", map[string]any{"charge_id": 42})
	if !again.IsError || callMeta(again)["replayed"] != true || callMeta(again)["state"] != "failed" {
		t.Errorf("retry of a failed call = %v, want replayed failure", again.Meta)
	}
	if got := count(t, b.db.Read, `SELECT count(*) FROM effects`); got != 0 {
		t.Errorf("effects of a failed call = %d, want 0", got)
	}
}

func TestCall_FailedCallKeepsNoWrites(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l, _ := outbox.New(db, nil)
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	outbox.AddTool(l, s, &mcp.Tool{Name: "half"}, func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (1, 'usd', 0)`); err != nil {
			return nil, struct{}{}, err
		}
		if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: "x", Path: "/y"}); err != nil {
			return nil, struct{}{}, err
		}
		return nil, struct{}{}, outbox.Final(errors.New("declined after writing"))
	}, nil)
	res := call(t, connect(t, s), "half", "h1", map[string]any{})
	if !res.IsError {
		t.Fatal("want an error result")
	}
	if n := count(t, db.Read, `SELECT count(*) FROM charges`) + count(t, db.Read, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("a failed call left %d rows", n)
	}
}

func TestCall_BadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	for _, tc := range []struct {
		name string
		key  any
		args any
		want string
	}{
		{"LongKey", strings.Repeat("k", 256), map[string]any{"amount": 1}, "256 bytes"},
		{"ControlChar", "a\x07b", map[string]any{"amount": 1}, "control character"},
		{"EmptyKey", "", map[string]any{"amount": 1}, "empty"},
		{"NonStringKey", 42, map[string]any{"amount": 1}, "must be a string"},
		{"SchemaViolation", "s1", map[string]any{"amount": "abc"}, "amount"},
		{"MissingArgument", "s2", map[string]any{}, "amount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &mcp.CallToolParams{Name: "charge", Arguments: tc.args, Meta: mcp.Meta{"idempotencyKey": tc.key}}
			res, err := b.session.CallTool(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if !res.IsError || !strings.Contains(text(res), tc.want) {
				t.Errorf("got %v %q, want an error containing %q", res.IsError, text(res), tc.want)
			}
		})
	}
	if _, err := b.session.CallTool(context.Background(), &mcp.CallToolParams{Name: "nope", Arguments: map[string]any{}}); err == nil {
		t.Error("unknown tool: want an error")
	}
	if n := count(t, b.db.Read, `SELECT count(*) FROM calls`) + charges(t, b); n != 0 {
		t.Errorf("bad input left %d rows", n)
	}
}

func TestCall_Annotations(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	res := call(t, b.session, "balance", "b1", map[string]any{})
	if res.IsError || res.Meta[outbox.MetaKeyCall] != nil {
		t.Fatalf("read-only tool: %v %s", res.Meta, text(res))
	}
	if got := count(t, b.db.Read, `SELECT count(*) FROM calls`); got != 0 {
		t.Errorf("read-only tool recorded %d calls", got)
	}

	for _, record := range []bool{false, true} {
		db := openDB(t)
		l, _ := outbox.New(db, &outbox.Options{RecordIdempotent: record})
		s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
		outbox.AddTool(l, s, &mcp.Tool{Name: "set", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
			func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES (1, 'usd', 0)`)
				return nil, struct{}{}, err
			}, nil)
		cs := connect(t, s)
		call(t, cs, "set", "i1", map[string]any{})
		call(t, cs, "set", "i1", map[string]any{})
		want := 2
		if record {
			want = 1
		}
		if got := count(t, db.Read, `SELECT count(*) FROM charges`); got != want {
			t.Errorf("idempotentHint tool, RecordIdempotent=%v: ran %d times, want %d", record, got, want)
		}
	}
}

func TestCall_Capability(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	caps := b.session.InitializeResult().Capabilities
	got, ok := caps.Experimental[outbox.CapabilityName].(map[string]any)
	if !ok {
		t.Fatalf("capabilities.experimental = %v, want %q", caps.Experimental, outbox.CapabilityName)
	}
	if got["statusTool"] != outbox.StatusToolName || got["fingerprintWindowSeconds"] != float64(300) {
		t.Errorf("capability = %v", got)
	}
}

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a wait for a result
	}
}
