package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
)

// drainProgressEvery is how often Drain reports progress at most.
const drainProgressEvery = 100 * time.Millisecond

// Drain delivers effects until none of a configured destination is pending
// or in flight, or ctx ends; retries that come due meanwhile are made.
// Effects left dead or unknown are reported, not waited for. progress, if
// not nil, is called with the current counts after a round, at most every
// drainProgressEvery: counting reads every effect's index entry (about
// 0.1 s per million), too much for every round.
func (d *Dispatcher) Drain(ctx context.Context, progress func(opsquery.Counts)) (opsquery.Counts, error) {
	// ended is the answer once ctx has ended, wherever that was found:
	// the counts as they stand, so that a timeout that passes inside a
	// round (or before the first) reports the effects still pending
	// rather than none, which read as drained.
	ended := func(err error) (opsquery.Counts, error) {
		c, cerr := opsquery.CountEffects(context.WithoutCancel(ctx), d.db)
		return c, errors.Join(err, cerr)
	}
	if err := d.requireKeyFile(ctx); err != nil {
		if ctx.Err() != nil {
			return ended(err)
		}
		return opsquery.Counts{}, err
	}
	d.stopping.Store(false)
	defer d.closeStatements()
	defer d.settle(ctx)
	stopListener := d.startListener(ctx)
	defer stopListener()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var lastProgress time.Time
	failures := 0
	for {
		next, err := d.round(ctx, ctx)
		open := true
		if err == nil {
			open, err = d.openEffects(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ended(err)
			}
			if !d.transient(err) {
				return opsquery.Counts{}, err
			}
			// A database restarting or failing over, or a lock held by
			// another process, passes: drain is for deploy hooks, which
			// run exactly when such things happen. Its timeout (ctx)
			// bounds the waiting.
			failures++
			next = backoff(failures, drainRetryFirst, drainRetryLast, d.opts.Rand())
			d.logger.WarnContext(ctx, "drain: database error; trying again", "error", err, "failures", failures, "wait", next)
		} else {
			failures = 0
		}
		if progress != nil && time.Since(lastProgress) >= drainProgressEvery {
			lastProgress = time.Now()
			if c, err := opsquery.CountEffects(ctx, d.db); err == nil {
				progress(c)
			}
		}
		if !open {
			d.inflight.Wait()
			if open, err = d.openEffects(ctx); err != nil && d.transient(err) && ctx.Err() == nil {
				open = true // counted below, once the store answers again
			} else if err != nil || !open {
				c, cerr := opsquery.CountEffects(context.WithoutCancel(ctx), d.db)
				return c, errors.Join(err, cerr)
			}
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			d.settle(ctx)
			return ended(ctx.Err())
		case <-d.wake:
		case <-timer.C:
		}
	}
}

// Waits of Drain between rounds that failed with a transient database
// error: doubling from drainRetryFirst up to drainRetryLast, jittered.
const (
	drainRetryFirst = 100 * time.Millisecond
	drainRetryLast  = 5 * time.Second
)

// transient reports whether err is the database failing for a while rather
// than the statement: PostgreSQL unreachable, restarting or out of
// resources (schema.DB.Unavailable) or losing to another transaction
// (serialization failure, deadlock, lock timeout), or SQLite's lock held by
// another process past busy_timeout (SQLITE_BUSY, SQLITE_LOCKED) or an I/O
// error.
func (d *Dispatcher) transient(err error) bool {
	if d.db.Unavailable(err) {
		return true
	}
	switch pgcode.Of(err) {
	case pgcode.SerializationFailure, pgcode.DeadlockDetected, pgcode.LockNotAvailable:
		return true // another transaction won this time
	}
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() & 0xff { // the primary code
	case 5, 6, 10: // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR
		return true
	}
	return false
}

// settle stops claiming, releases the queued claims, and waits for the
// attempts in flight and their outcomes' commits, releasing what those
// commits claimed meanwhile.
func (d *Dispatcher) settle(ctx context.Context) {
	d.stopping.Store(true)
	d.releaseQueued(ctx)
	d.inflight.Wait()
	d.releaseQueued(ctx)
}

// openEffects reports whether effects of configured destinations still
// need delivery work.
func (d *Dispatcher) openEffects(ctx context.Context) (bool, error) {
	if d.busy() {
		return true, nil // this dispatcher's own work is open; no need to ask
	}
	st, err := d.statements(ctx)
	if err != nil {
		return false, err
	}
	for name := range d.dests {
		var open bool
		if err := st.open.QueryRowContext(ctx, name).Scan(&open); err != nil {
			return false, fmt.Errorf("look for open effects: %w", err)
		}
		if open {
			return true, nil
		}
	}
	return false, nil
}
