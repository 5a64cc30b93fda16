package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
)

// outcome is the result of one attempt, as recorded.
type outcome struct {
	state     string // delivered, pending (retry), dead, unknown
	status    int
	err       string
	response  []byte
	next      time.Time
	delivered time.Time
	keepSent  bool // unknown keeps send_started_at: the request may have left
}

// record queues an attempt's outcome for the next commit. Outcomes share
// commits: the first one to find no commit under way starts a goroutine
// that writes it and every outcome that arrives meanwhile in one
// transaction, batch after batch, and ends when none is left. Deliveries
// finishing together thus cost one fsync, not one each, and no goroutine
// waits per outcome. The same transactions claim the next effects for the
// queues (see commitOutcomes).
//
// An outcome is written only while this dispatcher still holds the lease;
// otherwise another dispatcher owns the effect, and this attempt's outcome
// must not count (see report).
func (d *Dispatcher) record(ctx context.Context, ds *destState, e *claimedEffect, o outcome, took time.Duration) {
	r := &pendingRecord{ds: ds, e: e, o: o, took: took}
	d.recMu.Lock()
	d.recQueue = append(d.recQueue, r)
	start := !d.writing
	d.writing = true
	d.recMu.Unlock()
	if start {
		// Counted like an attempt, so that Run and Drain do not return
		// while it runs. The caller's attempt is still counted: the count
		// is not zero here.
		d.inflight.Add(1)
		go func() {
			defer d.inflight.Done()
			d.writeLoop(context.WithoutCancel(ctx))
		}()
	}
}

func (d *Dispatcher) writeLoop(ctx context.Context) {
	for {
		d.recMu.Lock()
		batch := d.recQueue
		d.recQueue = nil
		if len(batch) == 0 {
			d.writing = false
			d.recMu.Unlock()
			// Rounds skip their own claims while a commit is under way
			// (see fill): one may be needed now.
			d.Notify()
			return
		}
		d.recMu.Unlock()
		d.writeOutcomes(ctx, batch)
	}
}

// committing reports whether outcomes, and with them claims, are being
// written (see commitOutcomes). The writer wakes the dispatcher when it
// stops.
func (d *Dispatcher) committing() bool {
	d.recMu.Lock()
	defer d.recMu.Unlock()
	return d.writing
}

// pendingRecord is an outcome waiting for a shared commit.
type pendingRecord struct {
	ds   *destState
	e    *claimedEffect
	o    outcome
	took time.Duration // the attempt's HTTP exchange; zero without one
	ok   bool          // the lease was still held: the outcome counts
}

// errClaimAhead marks a claim that failed inside an outcomes' transaction:
// the outcomes are then written again without it, since they matter more.
var errClaimAhead = errors.New("claim ahead")

// Outcomes that could not be written are written again, after waits from
// outcomeRetryFirst doubling up to outcomeRetryLast, for as long as their
// leases hold. They are known only here: given up, each effect would wait
// out its lease, be reclaimed and sent again, and at an at_most_once
// destination become unknown although its answer had come. Written again,
// each goes in a transaction of its own, so that one outcome the database
// keeps refusing does not hold back the others of its batch.
const (
	outcomeRetryFirst = 10 * time.Millisecond
	outcomeRetryLast  = time.Second
)

func (d *Dispatcher) writeOutcomes(ctx context.Context, batch []*pendingRecord) {
	claimed, err := d.commitOutcomes(ctx, batch, !d.stopping.Load())
	if errors.Is(err, errClaimAhead) {
		d.logger.WarnContext(ctx, "claim with outcomes", "error", err)
		claimed, err = d.commitOutcomes(ctx, batch, false)
	}
	if err == nil {
		metrics.Commit(d.opts.Metrics, metrics.CommitDeliveries, len(batch))
		d.enqueue(claimed)
		for _, r := range batch {
			d.report(ctx, r, nil)
			d.done()
		}
		return
	}
	// The writes are fenced by owner, so writing again can only record
	// outcomes of effects still leased to this dispatcher; past the
	// earliest lease an effect may have been reclaimed, and leased again
	// by this same owner for another attempt, whose outcome is its own.
	lease := batch[0].e.leaseUntil
	for _, r := range batch[1:] {
		if r.e.leaseUntil.Before(lease) {
			lease = r.e.leaseUntil
		}
	}
	left := batch
	for wait := outcomeRetryFirst; len(left) > 0 && d.now().Add(wait).Before(lease); wait = min(2*wait, outcomeRetryLast) {
		d.logger.WarnContext(ctx, "record delivery outcomes; trying again", "error", err, "outcomes", len(left), "wait", wait)
		t := time.NewTimer(wait)
		<-t.C
		var still []*pendingRecord
		for _, r := range left {
			if _, werr := d.commitOutcomes(ctx, []*pendingRecord{r}, false); werr != nil {
				err = werr
				still = append(still, r)
				continue
			}
			metrics.Commit(d.opts.Metrics, metrics.CommitDeliveries, 1)
			d.report(ctx, r, nil)
			d.done()
		}
		left = still
	}
	for _, r := range left {
		d.report(ctx, r, err)
		d.done()
	}
}

// report logs and counts a written outcome, or says why it was not.
func (d *Dispatcher) report(ctx context.Context, r *pendingRecord, err error) {
	d.sending.Delete(r.e.id)
	switch {
	case err != nil:
		d.logger.ErrorContext(ctx, "record delivery outcome", "effect", r.e.id, "error", err)
	case !r.ok:
		d.logger.WarnContext(ctx, "lease lost before the outcome was recorded; another dispatcher owns the effect", "effect", r.e.id)
	default:
		// Counted only once recorded, so the counters agree with the
		// database: an outcome whose lease was lost is another's to count.
		metrics.Delivery(d.opts.Metrics, r.ds.Name, deliveryResult(r.o), r.e.attempts)
		// The event's attributes cost a hash of the key per delivery: skip
		// them when not even its highest level, Warn, would be written.
		if d.logger.Enabled(ctx, slog.LevelWarn) {
			d.logDelivery(ctx, r.ds, r.e, r.o, r.took)
		}
	}
}

// commitOutcomes writes batch in one transaction and, if claim, leases the
// effects the queues need in the same one: the claims then cost neither a
// transaction nor a wait for the writer of their own.
func (d *Dispatcher) commitOutcomes(ctx context.Context, batch []*pendingRecord, claim bool) (map[*destState][]*claimedEffect, error) {
	st := d.stmts.Load()
	tx, err := d.db.Write.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	stmt := tx.StmtContext(ctx, st.record)
	now := d.now().UnixMilli()
	for _, r := range batch {
		o := r.o
		var delivered, sent, resp any
		if !o.delivered.IsZero() {
			delivered = o.delivered.UnixMilli()
		}
		if o.keepSent {
			sent = now
		}
		next := now
		if !o.next.IsZero() {
			next = o.next.UnixMilli()
		}
		if o.response != nil && d.sealer == nil {
			resp = string(o.response)
		}
		res, err := stmt.ExecContext(ctx,
			o.state, o.status, o.err, resp, next, delivered, sent, now, r.e.id, d.owner)
		if err != nil {
			return nil, fmt.Errorf("record outcome of %s: %w", r.e, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return nil, fmt.Errorf("record outcome of %s: %w", r.e, err)
		}
		r.ok = n == 1
	}
	var claimed map[*destState][]*claimedEffect
	if claim {
		// After the outcomes: an effect delivered here lets the next
		// effect of its call be claimed in the same commit.
		cstmt := tx.StmtContext(ctx, st.claim)
		for _, ds := range d.dests {
			n := d.need(ds)
			if n <= 0 {
				continue
			}
			es, err := d.claimIn(ctx, cstmt, ds.Name, n)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errClaimAhead, err)
			}
			if len(es) > 0 {
				if claimed == nil {
					claimed = map[*destState][]*claimedEffect{}
				}
				claimed[ds] = es
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit outcomes: %w", err)
	}
	return claimed, nil
}
