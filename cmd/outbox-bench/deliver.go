package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Target 4: effects delivered per second by the dispatcher against a bare
// http.Client posting the same bodies to the same loopback sink, both with
// the default concurrency.

// sink is a loopback HTTP server that reads each request and answers 200.
type sink struct {
	url      *url.URL
	srv      *http.Server
	requests atomic.Int64
	first    atomic.Pointer[chan struct{}] // closed at the next request, then cleared
}

func startSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s := &sink{}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.requests.Add(1)
		if ch := s.first.Swap(nil); ch != nil {
			close(*ch)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"ch_1","object":"charge"}`)
	})}
	go func() { _ = s.srv.Serve(ln) }()
	s.url, _ = url.Parse("http://" + ln.Addr().String())
	return s, nil
}

func (s *sink) close() { s.srv.Close() }

// armFirst returns a channel closed at the sink's next request.
func (s *sink) armFirst() <-chan struct{} {
	ch := make(chan struct{})
	s.first.Store(&ch)
	return ch
}

func effectBody(i int) []byte {
	return fmt.Appendf(nil, `{"charge_id":%d,"amount":%d,"currency":"eur"}`, i+1, 100+i%1000)
}

func effectKey(i int) string { return fmt.Sprintf("bench_%d", i) }

const insertEffect = `
INSERT INTO effects (seq, destination, method, path, headers, body, idempotency_key, state, next_attempt_at, created_at, updated_at)
VALUES (1, $1, 'POST', '/v1/charges', '{"Content-Type":"application/json"}', $2, $3, 'pending', 0, $4, $4)`

// insertPending writes n pending effects for destination dest in one
// transaction.
func insertPending(ctx context.Context, db *sql.DB, dest string, n int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, insertEffect)
	if err != nil {
		return err
	}
	defer stmt.Close()
	now := time.Now().UnixMilli()
	for i := range n {
		if _, err := stmt.ExecContext(ctx, dest, effectBody(i), effectKey(i), now); err != nil {
			return fmt.Errorf("insert effect: %w", err)
		}
	}
	return tx.Commit()
}

func (e *env) measureDelivery(ctx context.Context) (Result, error) {
	s, err := startSink()
	if err != nil {
		return Result{}, err
	}
	defer s.close()
	var disp, bare float64
	for round := range e.cfg.Rounds {
		e.logf("target 4: %d effects, dispatcher, round %d of %d", e.cfg.Effects, round+1, e.cfg.Rounds)
		r, err := e.dispatchOnce(ctx, s, round)
		if err != nil {
			return Result{}, fmt.Errorf("dispatcher: %w", err)
		}
		disp = max(disp, r)
		e.logf("target 4: %d effects, bare http.Client, round %d of %d", e.cfg.Effects, round+1, e.cfg.Rounds)
		if r, err = bareClient(ctx, s, e.cfg.Effects); err != nil {
			return Result{}, fmt.Errorf("bare client: %w", err)
		}
		bare = max(bare, r)
	}
	return newResult(4, fmt.Sprintf("dispatcher, concurrency %d", dispatch.DefaultConcurrency), "effects/s",
		disp, bare, "bare http.Client", AtLeastRatio(0.5)), nil
}

// dispatchOnce delivers cfg.Effects pending effects with one Drain and
// returns effects per second.
func (e *env) dispatchOnce(ctx context.Context, s *sink, round int) (float64, error) {
	db, err := schema.Open(ctx, filepath.Join(e.dir, fmt.Sprintf("deliver-%d.db", round)), nil)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if err := insertPending(ctx, db.Write, "sink", e.cfg.Effects); err != nil {
		return 0, err
	}
	d, err := dispatch.New(db, &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "sink", URL: s.url}},
	})
	if err != nil {
		return 0, err
	}
	before := s.requests.Load()
	start := time.Now()
	c, err := d.Drain(ctx, nil)
	elapsed := time.Since(start)
	if err != nil {
		return 0, err
	}
	if got := s.requests.Load() - before; c.Delivered != e.cfg.Effects || c.Open() != 0 || got != int64(e.cfg.Effects) {
		return 0, fmt.Errorf("after drain: %+v, %d requests; want %d delivered", c, got, e.cfg.Effects)
	}
	return float64(e.cfg.Effects) / elapsed.Seconds(), nil
}

// bareClient posts n bodies with the dispatcher's headers and concurrency
// and returns requests per second.
func bareClient(ctx context.Context, s *sink, n int) (float64, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64 // as the dispatcher's transport
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	target := s.url.JoinPath("/v1/charges").String()
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = effectBody(i)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, dispatch.DefaultConcurrency)
	start := time.Now()
	for range dispatch.DefaultConcurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := post(ctx, client, target, bodies[i], effectKey(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

func post(ctx context.Context, client *http.Client, target string, body []byte, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(outbox.HeaderIdempotencyKey, callkey.HeaderValue(key))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, dispatch.DefaultResponseLimit))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
