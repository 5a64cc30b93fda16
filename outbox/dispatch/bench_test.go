package dispatch_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Delivery benchmarks against a loopback sink: a plain net/http server that
// reads each request and answers 200, so that the figures measure the
// dispatcher, not a recording fake. synchronous=FULL throughout (openDB's
// default), as in production.

// benchConcurrency is the destination's concurrency, the default.
const benchConcurrency = dispatch.DefaultConcurrency

// sink is a loopback HTTP server answering 200 to everything.
type sink struct {
	url      *url.URL
	requests atomic.Int64
	first    atomic.Pointer[chan struct{}] // closed at the next request, then cleared
}

func startSink(b *testing.B) *sink {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := &sink{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.requests.Add(1)
		if ch := s.first.Swap(nil); ch != nil {
			close(*ch)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"ch_1","object":"charge"}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	s.url, _ = url.Parse("http://" + ln.Addr().String())
	return s
}

// armFirst returns a channel closed at the sink's next request.
func (s *sink) armFirst() <-chan struct{} {
	ch := make(chan struct{})
	s.first.Store(&ch)
	return ch
}

// benchBody is effect i's body, like the ledger's charge effect.
func benchBody(i int) []byte {
	return fmt.Appendf(nil, `{"charge_id":%d,"amount":%d,"currency":"eur"}`, i+1, 100+i%1000)
}

func benchKey(i int) string { return "bench_" + strconv.Itoa(i) }

// insertPending writes n pending effects to destination "sink", due at
// once, in one transaction.
func insertPending(b *testing.B, db *schema.DB, n int) {
	b.Helper()
	ctx := context.Background()
	tx, err := db.Write.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `
INSERT INTO effects (seq, destination, method, path, headers, body, idempotency_key, state, next_attempt_at, created_at, updated_at)
VALUES (1, 'sink', 'POST', '/v1/charges', '{"Content-Type":"application/json"}', $1, $2, 'pending', 0, $3, $4)`)
	if err != nil {
		b.Fatal(err)
	}
	defer stmt.Close()
	now := time.Now().UnixMilli()
	for i := range n {
		if _, err := stmt.ExecContext(ctx, benchBody(i), benchKey(i), now, now); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

// openBenchDB opens a fresh database with the outbox tables at the given
// durability (openDB always uses the default, FULL).
func openBenchDB(b *testing.B, durability schema.Durability) *schema.DB {
	b.Helper()
	db, err := schema.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), &schema.Options{Durability: durability})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

func benchDispatcher(b *testing.B, db *schema.DB, s *sink) *dispatch.Dispatcher {
	b.Helper()
	d, err := dispatch.New(db, &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "sink", URL: s.url, Concurrency: benchConcurrency}},
	})
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkDeliver measures effects delivered per second: b.N pending
// effects, inserted before the timer starts, delivered by one
// Dispatcher.Drain with the default concurrency (4). One op is one effect.
// bare-http-client posts the same b.N bodies, with the same headers and
// concurrency, with a plain http.Client (the transport settings the
// dispatcher uses): what the sink and the loopback cost without the outbox.
// Compare effects/s of the two. dispatcher-normal is the dispatcher with
// synchronous=NORMAL, to tell the fsyncs from the rest.
//
// Each op is a whole effect, so give it enough of them, for example
// -bench '^BenchmarkDeliver$' -benchtime 5000x.
func BenchmarkDeliver(b *testing.B) {
	for _, tc := range []struct {
		name       string
		durability schema.Durability
	}{{"dispatcher", schema.DurabilityFull}, {"dispatcher-normal", schema.DurabilityNormal}} {
		b.Run(tc.name, func(b *testing.B) {
			s := startSink(b)
			db := openBenchDB(b, tc.durability)
			insertPending(b, db, b.N)
			d := benchDispatcher(b, db, s)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			b.ResetTimer()
			start := time.Now()
			c, err := d.Drain(ctx, nil)
			elapsed := time.Since(start)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			if c.Delivered != b.N || c.Open() != 0 || s.requests.Load() != int64(b.N) {
				b.Fatalf("after drain: %+v, %d requests; want %d delivered", c, s.requests.Load(), b.N)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "effects/s")
		})
	}

	b.Run("bare-http-client", func(b *testing.B) {
		s := startSink(b)
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64 // as the dispatcher's transport
		b.Cleanup(tr.CloseIdleConnections)
		client := &http.Client{Transport: tr}
		target := s.url.JoinPath("/v1/charges").String()
		bodies := make([][]byte, b.N)
		for i := range bodies {
			bodies[i] = benchBody(i)
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, benchConcurrency)
		b.ResetTimer()
		start := time.Now()
		for range benchConcurrency {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= b.N {
						return
					}
					req, err := http.NewRequest(http.MethodPost, target, bytes.NewReader(bodies[i]))
					if err != nil {
						errs <- err
						return
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set(outbox.HeaderIdempotencyKey, callkey.HeaderValue(benchKey(i)))
					resp, err := client.Do(req)
					if err != nil {
						errs <- err
						return
					}
					_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, dispatch.DefaultResponseLimit))
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						errs <- fmt.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		if s.requests.Load() != int64(b.N) {
			b.Fatalf("%d requests, want %d", s.requests.Load(), b.N)
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "effects/s")
	})
}

// BenchmarkStartToFirstDelivery measures how long a dispatcher takes from
// New and Run to the sink's first request, with 10,000 pending
// effects in the database (a restart after a backlog built up), and, for
// comparison, with one. The effects are made pending again between
// iterations, outside the timer.
func BenchmarkStartToFirstDelivery(b *testing.B) {
	for _, backlog := range []int{10_000, 1} {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) { benchStartToFirst(b, backlog) })
	}
}

func benchStartToFirst(b *testing.B, backlog int) {
	s := startSink(b)
	db := openDB(b)
	insertPending(b, db, backlog)
	repend := func() {
		if _, err := db.Write.Exec(`UPDATE effects SET state = 'pending', attempts = 0, next_attempt_at = 0,
    lease_owner = '', lease_until = 0, delivered_at = NULL, last_status = 0, response = NULL`); err != nil {
			b.Fatal(err)
		}
		// Else the dispatcher's first commit would pay for checkpointing
		// the pages this update wrote to the WAL.
		if _, err := db.Write.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			b.Fatal(err)
		}
	}
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		repend()
		first := s.armFirst()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()

		start := time.Now()
		d := benchDispatcher(b, db, s)
		go func() { done <- d.Run(ctx) }()
		select {
		case <-first:
		case err := <-done:
			b.Fatalf("dispatcher stopped before its first delivery: %v", err)
		case <-time.After(time.Minute):
			b.Fatal("no delivery within a minute")
		}
		total += time.Since(start)

		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms-to-first")
}
