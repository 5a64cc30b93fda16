package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// BenchmarkServeStartToFirstDelivery measures, with 10,000 effects pending
// (and, as the baseline, one) and 1,000 calls already recorded, the time from starting the
// `mcp-outbox serve` process to the destination receiving its first
// request: process start, database open and migration check, and the
// dispatcher's first round. The backlog is set back to pending between
// iterations, outside the timer.
//
//	go test -run '^$' -bench ServeStartToFirstDelivery -benchtime 10x ./cmd/mcp-outbox/e2e/
func BenchmarkServeStartToFirstDelivery(b *testing.B) {
	for _, pending := range []int{1, 10_000} {
		b.Run(fmt.Sprintf("backlog=%d", pending), func(b *testing.B) { benchServeStart(b, pending) })
	}
}

func benchServeStart(b *testing.B, pending int) {
	const history = 1_000
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "start.db")
	db, err := schema.Open(ctx, path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if err := ledger.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UnixMilli()
	// Recursive CTEs fill the tables in one statement each.
	if _, err := db.Write.Exec(`
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, result, created_at, completed_at, expires_at)
SELECT 'call_h' || i, 'local', 'history-' || i, 'meta', 'charge', '', 'completed', '{}', ?2, ?2, ?2 + 86400000 FROM n`,
		history, now); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Write.Exec(`
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
INSERT INTO effects (seq, destination, method, path, body, idempotency_key, next_attempt_at, created_at, updated_at)
SELECT 1, 'payments', 'POST', '/v1/charges', '{}', 'bench-' || i, 0, ?2, ?2 FROM n`, pending, now); err != nil {
		b.Fatal(err)
	}

	var first atomic.Pointer[chan struct{}]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if ch := first.Swap(nil); ch != nil {
			close(*ch)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	dest := fmt.Sprintf("payments=http://%s", ln.Addr())

	for b.Loop() {
		b.StopTimer()
		if _, err := db.Write.Exec(`UPDATE effects SET state = 'pending', attempts = 0, lease_owner = '', lease_until = 0, next_attempt_at = 0`); err != nil {
			b.Fatal(err)
		}
		if _, err := db.Write.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			b.Fatal(err)
		}
		ch := make(chan struct{})
		first.Store(&ch)
		cmd := exec.Command(bin, "serve", "--db", path, "--dest", dest, "--log-level", "error")
		stdin, err := cmd.StdinPipe() // held open: stdio serve ends at EOF
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			b.Fatal("no delivery within 30s of start")
		}
		b.StopTimer()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		stdin.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms-to-first")
}
