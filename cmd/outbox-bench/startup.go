package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Target 5: from opening the database to the destination's first request,
// with the whole history and its backlog of pending effects, against a
// database holding one call and its pending effect. In-process, as
// `mcp-outbox serve` starts after exec: open and migration check, layer,
// dispatcher, first round.

const repend = `
UPDATE effects SET state = 'pending', attempts = 0, lease_owner = '', lease_until = 0, next_attempt_at = 0,
    send_started_at = NULL, delivered_at = NULL, last_status = 0, last_error = '', response = NULL
WHERE id >= $1`

func (e *env) measureStartup(ctx context.Context, big *history) (Result, error) {
	s, err := startSink()
	if err != nil {
		return Result{}, err
	}
	defer s.close()
	small, err := e.seedHistory(ctx, "startup-small.db", 1, 1)
	if err != nil {
		return Result{}, err
	}
	var d [2][]time.Duration
	for run := range e.cfg.Starts {
		for i, h := range []*history{small, big} {
			e.logf("target 5: start with %s calls and %s pending effects, run %d of %d",
				group(int64(h.calls)), group(int64(h.pending)), run+1, e.cfg.Starts)
			took, err := startOnce(ctx, h, s)
			if err != nil {
				return Result{}, err
			}
			d[i] = append(d[i], took)
		}
	}
	ms := func(d []time.Duration) float64 { return float64(percentile(d, 0.5).Nanoseconds()) / 1e6 }
	r := newResult(5, fmt.Sprintf("start → first delivery, %s calls + %s pending", group(int64(big.calls)), group(int64(big.pending))),
		"ms", ms(d[1]), ms(d[0]), "1 call + 1 pending", AtMost(200))
	r.Note = fmt.Sprintf("median of %d starts; in-process (open, migration check, layer, dispatcher), without the exec of a binary", e.cfg.Starts)
	return r, nil
}

// startOnce sets h's backlog pending again, then times a start up to the
// sink's first request.
func startOnce(ctx context.Context, h *history, s *sink) (time.Duration, error) {
	db, err := schema.Open(ctx, h.path, nil)
	if err != nil {
		return 0, err
	}
	_, err = db.Write.ExecContext(ctx, repend, h.firstPending)
	if err == nil {
		// Else the first commit after the start would checkpoint it.
		_, err = db.Write.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	}
	if err = errors.Join(err, db.Close()); err != nil {
		return 0, fmt.Errorf("set the backlog pending: %w", err)
	}

	first := s.armFirst()
	start := time.Now()
	db, err = openLedger(ctx, h.path)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	layer, err := outbox.New(db, nil)
	if err != nil {
		return 0, err
	}
	d, err := dispatch.New(db, &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "payments", URL: s.url}},
	})
	if err != nil {
		return 0, err
	}
	layer.OnEnqueue(d.Notify)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(rctx) }()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	select {
	case <-first:
	case err := <-done:
		return 0, fmt.Errorf("dispatcher stopped before its first delivery: %v", err)
	case <-timeout.C:
		cancel()
		<-done
		return 0, errors.New("no delivery within a minute of the start")
	}
	took := time.Since(start)
	cancel()
	return took, <-done
}
