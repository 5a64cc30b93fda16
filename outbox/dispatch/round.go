package dispatch

import (
	"context"
	"fmt"
	"time"
)

// round reclaims expired leases, claims what is due for every destination
// (enough for its free slots and a queue ahead of them), starts the
// attempts, and says how long to wait before the next round if nothing
// wakes the dispatcher.
func (d *Dispatcher) round(ctx, reqCtx context.Context) (time.Duration, error) {
	if len(d.dests) == 0 {
		return d.opts.PollInterval, nil
	}
	st, err := d.statements(ctx)
	if err != nil {
		return 0, err
	}
	// Leases expire on the scale of the poll interval, so looking for them
	// more often than that would only cost a query and a write per
	// delivery.
	if now := time.Now(); now.Sub(d.lastReclaim) >= d.opts.PollInterval {
		if err := d.reclaim(ctx); err != nil {
			return 0, err
		}
		d.lastReclaim = now
	}
	var open []*destState
	for _, ds := range d.dests {
		if err := d.probeUnknown(ctx, ds); err != nil {
			return 0, err
		}
		if err := d.fill(ctx, st, ds); err != nil {
			return 0, err
		}
		if err := d.start(ctx, reqCtx, st, ds); err != nil {
			return 0, err
		}
		// With every slot taken, the next attempt waits for one to free,
		// which wakes the dispatcher: only a destination that could start
		// something needs to know when its next effect is due.
		if len(ds.slots) < cap(ds.slots) {
			open = append(open, ds)
		}
	}
	return d.untilNextDue(ctx, st, open)
}

// Bounds of a destination's queue ahead of its free slots: attempts per
// slot, and effects in all.
const (
	maxQueuePerSlot = 32
	maxQueue        = 256
)

// need is how many effects ds's queue lacks: one per free slot, plus the
// queue ahead (see ahead).
func (d *Dispatcher) need(ds *destState) int {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return cap(ds.slots) - len(ds.slots) + ds.ahead(d.opts.Lease) - len(ds.queue)
}

// ahead is how many claimed effects ds keeps queued beyond its free slots.
// Outcomes commit in groups, each waiting for an fsync that takes several
// attempts' time, and the effects a commit claims (commitOutcomes) are
// only usable once it is done: a queue that covers about two commits keeps
// the slots busy meanwhile. A queued effect's lease runs while it waits,
// so the queue is as deep as a quarter of the lease allows at the measured
// exchange time: deep for a fast destination, one attempt per slot for a
// slow one or before the first exchange. ds.mu must be held.
func (ds *destState) ahead(lease time.Duration) int {
	perSlot := 1
	if ds.exchange > 0 {
		perSlot = int(min(max(lease/(4*ds.exchange), 1), maxQueuePerSlot))
	}
	return min(perSlot*ds.Concurrency, maxQueue)
}

// exchanged notes how long an attempt's HTTP exchange took, in a moving
// average that follows a change within a few dozen attempts.
func (ds *destState) exchanged(took time.Duration) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.exchange == 0 {
		ds.exchange = max(took, time.Microsecond)
		return
	}
	ds.exchange = max(ds.exchange+(took-ds.exchange)/8, time.Microsecond)
}

// enqueue appends committed claims to their queues and wakes the rounds
// that start them.
func (d *Dispatcher) enqueue(claimed map[*destState][]*claimedEffect) {
	if len(claimed) == 0 {
		return
	}
	for ds, es := range claimed {
		ds.mu.Lock()
		ds.queue = append(ds.queue, es...)
		ds.mu.Unlock()
	}
	d.Notify()
}

// fill claims effects for ds when its queue cannot cover the free slots.
// Under load the commits of outcomes fill the queues instead
// (commitOutcomes), at no transaction of their own; this claim serves a
// start, and effects that arrive while the dispatcher is idle.
//
// A queued effect whose lease runs short anyway (a destination slowing
// down, a long pause) is released by start instead of being sent.
func (d *Dispatcher) fill(ctx context.Context, st *dispatchStmts, ds *destState) error {
	ds.mu.Lock()
	free, queued := cap(ds.slots)-len(ds.slots), len(ds.queue)
	ds.mu.Unlock()
	if free == 0 || queued >= free || d.committing() {
		// A commit under way claims for the queue when it writes its
		// outcomes; a claim of our own would only wait for the writer
		// behind it. The writer wakes the dispatcher when it is done.
		return nil
	}
	claimed, err := d.claim(ctx, st, ds.Name, d.need(ds))
	if err != nil {
		return err
	}
	ds.mu.Lock()
	ds.queue = append(ds.queue, claimed...)
	ds.mu.Unlock()
	return nil
}

// start begins attempts of queued effects for ds's free slots.
func (d *Dispatcher) start(ctx, reqCtx context.Context, st *dispatchStmts, ds *destState) error {
	now := d.now()
	var stale []*claimedEffect
	ds.mu.Lock()
	for len(ds.queue) > 0 && len(ds.slots) < cap(ds.slots) {
		e := ds.pop()
		if !d.fresh(ds, e, now) {
			stale = append(stale, e)
			continue
		}
		ds.slots <- struct{}{}
		d.began()
		go d.run(reqCtx, ds, e)
	}
	ds.mu.Unlock()
	return d.release(ctx, st, stale)
}

// run makes attempts on one slot: e's, then those of queued effects, one
// after another, as long as the queue has one for it (see next).
//
// The goroutine keeps its slot from one attempt to the next: a goroutine
// per attempt grew a new stack through the HTTP client every time, and
// waking a round to start the next attempt waited for that goroutine to be
// scheduled; under load, every slot was found idle by then.
func (d *Dispatcher) run(ctx context.Context, ds *destState, e *claimedEffect) {
	for e != nil {
		e = d.deliver(ctx, ds, e)
	}
}

// next returns the queued effect the slot of an attempt just over serves
// next, or frees the slot and returns nil. A stale head is left to the
// round, which releases it.
func (d *Dispatcher) next(ds *destState) *claimedEffect {
	ds.mu.Lock()
	var e *claimedEffect
	if len(ds.queue) > 0 && !d.stopping.Load() && d.fresh(ds, ds.queue[0], d.now()) {
		e = ds.pop()
	}
	ds.mu.Unlock()
	if e == nil {
		<-ds.slots
		d.Notify() // a slot is free; a queued or due effect may take it
		return nil
	}
	d.began()
	return e
}

// fresh reports whether e's lease can still cover an attempt. A fresh
// claim always passes: the margin is at most half the lease.
func (d *Dispatcher) fresh(ds *destState, e *claimedEffect, now time.Time) bool {
	return e.leaseUntil.Sub(now) >= min(ds.Timeout, d.opts.Lease/2)
}

// pop takes the first queued effect. ds.mu must be held.
func (ds *destState) pop() *claimedEffect {
	e := ds.queue[0]
	ds.queue[0] = nil
	ds.queue = ds.queue[1:]
	if len(ds.queue) == 0 {
		ds.queue = nil // let the backing array go
	}
	return e
}

// began counts an attempt from its start to its recorded outcome; done
// ends it.
func (d *Dispatcher) began() {
	d.inflight.Add(1)
	d.active.Add(1)
}

func (d *Dispatcher) done() {
	if d.active.Add(-1) == 0 {
		// Idle: a round learns when a retry recorded meanwhile is due, and
		// Drain whether it is finished. While attempts go on, their
		// commits wake the rounds (see record and enqueue).
		d.Notify()
	}
	d.inflight.Done()
}

// busy reports whether this dispatcher holds effects: attempts started and
// not recorded, or claims queued.
func (d *Dispatcher) busy() bool {
	if d.active.Load() > 0 {
		return true
	}
	for _, ds := range d.dests {
		ds.mu.Lock()
		n := len(ds.queue)
		ds.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// releaseQueued gives back every queued claim, when the dispatcher stops:
// the next dispatcher need not wait for the leases to pass.
func (d *Dispatcher) releaseQueued(ctx context.Context) {
	var all []*claimedEffect
	for _, ds := range d.dests {
		ds.mu.Lock()
		all = append(all, ds.queue...)
		ds.queue = nil
		ds.mu.Unlock()
	}
	st := d.stmts.Load()
	if st == nil || len(all) == 0 {
		return
	}
	if err := d.release(context.WithoutCancel(ctx), st, all); err != nil {
		// They come back when their leases pass, or at once for the next
		// process once this one is gone.
		d.logger.ErrorContext(ctx, "release claimed effects", "error", err)
	}
}

// untilNextDue is the time until the earliest pending effect of the given
// destinations is due, bounded by the poll interval.
func (d *Dispatcher) untilNextDue(ctx context.Context, st *dispatchStmts, dests []*destState) (time.Duration, error) {
	now := d.now()
	wait := d.opts.PollInterval
	// Work already due but not claimed waits for a free slot or for the
	// effect before it in its call; both wake the dispatcher. So only
	// future times matter here.
	for _, ds := range dests {
		states := []string{"pending"}
		if ds.Probe != nil {
			states = append(states, "unknown")
		}
		for _, state := range states {
			var next *int64
			if err := st.nextDue.QueryRowContext(ctx, ds.Name, state, now.UnixMilli()).Scan(&next); err != nil {
				return 0, fmt.Errorf("read next due: %w", err)
			}
			if next != nil {
				wait = min(wait, time.UnixMilli(*next).Sub(now))
			}
		}
	}
	return max(wait, time.Millisecond), nil
}
