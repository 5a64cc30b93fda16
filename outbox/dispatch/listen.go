package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// On PostgreSQL every transaction that inserts effects notifies the
// channel mcp_outbox_effects at its commit (a trigger of the outbox
// migration), whichever replica or process wrote them. Each dispatcher
// listens on it, on a connection of its own outside the pool, and wakes as
// Notify wakes it: new effects of another replica are claimed at once
// rather than at the next poll. Polling stays: a notification lost while
// the connection was down only delays an effect until the next poll.
//
// The connection is the store's (schema.DB.Listen), so this package links
// no PostgreSQL client.
const listenEffects = "mcp_outbox_effects"

// Waits before connecting the listener again after it failed, doubling
// from the first to the last.
const (
	listenRetryFirst = 100 * time.Millisecond
	listenRetryLast  = 30 * time.Second
	// listenConnectTimeout bounds one attempt to connect and LISTEN.
	listenConnectTimeout = 10 * time.Second
)

// startListener runs the listener until the returned function is called,
// which waits for it to end. On SQLite there is nothing to listen to.
func (d *Dispatcher) startListener(ctx context.Context) (stop func()) {
	if d.db.Dialect != schema.Postgres {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.listen(ctx)
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// listen keeps a listening connection until ctx ends, connecting again
// with backoff whenever it drops.
func (d *Dispatcher) listen(ctx context.Context) {
	wait := listenRetryFirst
	for {
		err := d.listenOnce(ctx, func() { wait = listenRetryFirst })
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, schema.ErrNoListen) {
			// A store on the user's *sql.DB through a driver that wraps
			// pgx's (postgres.FromDB) has no connection to listen on:
			// polling alone, which trying again would not change.
			d.logger.InfoContext(ctx, "no notifications of new effects: polling", "reason", err)
			return
		}
		d.logger.WarnContext(ctx, "listen for new effects; polling meanwhile", "error", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, listenRetryLast)
	}
}

// listenOnce connects, listens and wakes the dispatcher on every
// notification until the connection fails or ctx ends. listening is called
// once the LISTEN is in place.
//
// A connection that dies without a word (a network partition) is noticed
// by TCP keep-alive, which pgx's dialer turns on; meanwhile polling goes on.
func (d *Dispatcher) listenOnce(ctx context.Context, listening func()) error {
	cctx, cancel := context.WithTimeout(ctx, listenConnectTimeout)
	defer cancel()
	l, err := d.db.Listen(cctx, listenEffects)
	if err != nil {
		return err
	}
	// The listener bounds its goodbye: the server may be what failed.
	defer func() { _ = l.Close(context.WithoutCancel(ctx)) }()
	listening()
	// Before the wake-up below, so that a test sees the listening first
	// and the idle wait that follows the round it causes.
	if h := d.testHookListening; h != nil {
		h()
	}
	// Effects committed while no connection listened were announced to
	// nobody: look once.
	d.Notify()
	for {
		if err := l.Wait(ctx); err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		d.Notify()
	}
}
