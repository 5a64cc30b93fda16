package outbox_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// BenchmarkCharge compares one sequential charge over in-memory transports:
// the ledger's charge keeping nothing (the limit), the bare ledger (no layer; the same handler, statements in autocommit),
// the layer with a new key per call, and a replay of a recorded call.
// synchronous=FULL throughout. Compare the sub-benchmarks of one run.
func BenchmarkCharge(b *testing.B) {
	ctx := context.Background()
	args := map[string]any{"amount": 100}
	b.Run("nothing-kept", func(b *testing.B) {
		s := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "v0"}, nil)
		ledger.RegisterNothingKept(s, nil)
		cs := connect(b, s)
		for b.Loop() {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare", func(b *testing.B) {
		db := openDB(b)
		s := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "v0"}, nil)
		ledger.RegisterBare(db, s, nil)
		cs := connect(b, s)
		for i := 0; b.Loop(); i++ {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("layer", func(b *testing.B) {
		bd := setup(b, nil, nil)
		for i := 0; b.Loop(); i++ {
			res, err := bd.session.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args,
				Meta: mcp.Meta{"idempotencyKey": fmt.Sprint("k", i)}})
			if err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		bd := setup(b, nil, nil)
		p := &mcp.CallToolParams{Name: "charge", Arguments: args, Meta: mcp.Meta{"idempotencyKey": "same"}}
		if _, err := bd.session.CallTool(ctx, p); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := bd.session.CallTool(ctx, p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkChargeConcurrent is target 1's load: 32 callers, each on its own
// session, distinct keys, synchronous=FULL. "bare-tx" is the ledger without
// the layer, one transaction (one fsync) per call; "layer" shares commits
// among the calls that end while others wait (group commit); "layer-batch1"
// is the layer with MaxBatchCalls 1, a commit per call. ns/op is per call.
func BenchmarkChargeConcurrent(b *testing.B) {
	const callers = 32
	ctx := context.Background()
	args := map[string]any{"amount": 100}
	run := func(b *testing.B, sessions []*mcp.ClientSession) {
		var next atomic.Int64
		b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			cs := sessions[int(next.Add(1)-1)%len(sessions)]
			for pb.Next() {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args,
					Meta: mcp.Meta{"idempotencyKey": fmt.Sprint("k", next.Add(1))}})
				if err != nil || res.IsError {
					b.Error(err, res)
					return
				}
			}
		})
	}
	b.Run("bare-tx", func(b *testing.B) {
		db := openDB(b)
		s := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "v0"}, nil)
		ledger.RegisterBareTransactional(db, s, nil)
		sessions := make([]*mcp.ClientSession, callers)
		for i := range sessions {
			sessions[i] = connect(b, s)
		}
		run(b, sessions)
	})
	for _, bc := range []struct {
		name  string
		batch int
	}{{"layer", 0}, {"layer-batch1", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			bd := setup(b, &outbox.Options{MaxBatchCalls: bc.batch}, nil)
			sessions := []*mcp.ClientSession{bd.session}
			for len(sessions) < callers {
				sessions = append(sessions, connect(b, bd.server))
			}
			run(b, sessions)
		})
	}
}

// BenchmarkReadOnly compares one sequential call of the ledger's balance,
// a readOnlyHint tool, over in-memory transports: the bare ledger (the
// same handler, its query on the read pool) and the layer, which runs the
// handler in a read-only transaction (PRAGMA query_only on SQLite, BEGIN
// READ ONLY on PostgreSQL) and records nothing. Compare the two of one run.
func BenchmarkReadOnly(b *testing.B) {
	ctx := context.Background()
	p := &mcp.CallToolParams{Name: "balance", Arguments: map[string]any{}}
	b.Run("bare", func(b *testing.B) {
		db := openDB(b)
		s := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "v0"}, nil)
		ledger.RegisterBare(db, s, nil)
		cs := connect(b, s)
		for b.Loop() {
			if res, err := cs.CallTool(ctx, p); err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})
	b.Run("layer", func(b *testing.B) {
		bd := setup(b, nil, nil)
		for b.Loop() {
			if res, err := bd.session.CallTool(ctx, p); err != nil || res.IsError {
				b.Fatal(err, res)
			}
		}
	})
}
