package dispatch

import (
	"context"
	"time"
)

// Run delivers effects until ctx ends. It starts at once, reclaiming the
// expired leases of a previous run. When ctx ends it stops claiming, lets
// attempts in flight finish for up to ShutdownTimeout, then cancels the rest
// and releases what it holds.
//
// On PostgreSQL it also listens for the notifications of new effects that
// any replica commits, and wakes on them as on Notify (see
// listen.go); PollInterval then only bounds how late an effect is
// found when a notification was lost.
func (d *Dispatcher) Run(ctx context.Context) error {
	if err := d.requireKeyFile(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it began: the end Run reports as nil
		}
		return err
	}
	d.running.Store(true)
	defer d.running.Store(false)
	d.stopping.Store(false)
	reqCtx, cancelReq := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReq()
	d.mu.Lock()
	d.cancelReq = cancelReq
	d.mu.Unlock()
	stopListener := d.startListener(ctx)
	defer stopListener()

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		next, err := d.round(ctx, reqCtx)
		if err != nil && ctx.Err() == nil {
			d.logger.ErrorContext(ctx, "dispatch round", "error", err)
			next = d.opts.PollInterval
		}
		timer.Reset(next)
		if h := d.testHookIdle; h != nil && len(d.wake) == 0 {
			h()
		}
		select {
		case <-ctx.Done():
			return d.shutdown(ctx, cancelReq)
		case <-d.wake:
		case <-timer.C:
		}
	}
}

func (d *Dispatcher) shutdown(ctx context.Context, cancelReq context.CancelFunc) error {
	defer d.closeStatements()
	d.stopping.Store(true)
	d.releaseQueued(ctx)
	done := make(chan struct{})
	go func() { d.inflight.Wait(); close(done) }()
	t := time.NewTimer(d.opts.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		d.logger.WarnContext(ctx, "shutdown timeout: cancelling deliveries in flight")
		cancelReq()
		<-done
	}
	d.releaseQueued(ctx) // claimed by outcomes' commits under way at the stop
	return nil
}

// CancelInFlight cancels the requests of the attempts in flight now, as
// Run's shutdown does once ShutdownTimeout passes. It is for a caller whose
// own deadline for the shutdown comes first (outbox.Runner.Stop calls it
// when its context ends): cancel Run's context, then call CancelInFlight,
// then wait for Run to return. A cancelled effect is sent again, with the
// same Idempotency-Key, by the next Run, or becomes unknown if its
// destination is AtMostOnce. Outside Run's shutdown it does nothing useful:
// attempts it cancels while Run still claims are retried as any failure.
func (d *Dispatcher) CancelInFlight() {
	d.mu.Lock()
	cancel := d.cancelReq
	d.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}
