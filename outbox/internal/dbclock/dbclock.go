// Package dbclock reads the time from the database server's clock, for
// the layer and the dispatcher on PostgreSQL, where replicas on several
// machines write and judge the same leases and due times: each replica's
// own clock may be minutes off the others' (a VM resumed, NTP not yet in
// step), and a lease written by one replica and read by another is only
// meaningful in one clock. PostgreSQL's is the one they share.
//
// Asking the server for every timestamp would add a round trip to every
// claim, so a Clock samples the server's clock_timestamp() once, and then
// counts from it by the process's monotonic clock: the server's time at
// the sample plus the time elapsed here since. A step of this machine's
// wall clock (a forward or backward jump) changes nothing, since the
// monotonic clock does not jump; its rate differs from the server's by
// parts per million, which a periodic sample corrects.
package dbclock

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// Resampling of a Clock.
const (
	// Every is how often a Clock on the real clock samples again, to
	// follow the drift between the two machines' clocks.
	Every = 5 * time.Minute
	// RetryEvery is how often a Clock that has no sample yet (the
	// server was unreachable) tries again, meanwhile running on the
	// local clock.
	RetryEvery = time.Second
	// SampleTimeout bounds one sample.
	SampleTimeout = 5 * time.Second
	// InjectedTolerance is the least offset from the server's clock that
	// a Clock on an injected clock corrects. Tests hold their clocks still
	// and move them by hand, so such a clock is behind the server by the
	// test's own running time, a second or so, and a test compares the
	// times written with its clock's: an offset under the tolerance is
	// that, not a skew, and is left alone. A skew a test injects on
	// purpose is minutes.
	InjectedTolerance = 10 * time.Second
)

// sampleQuery reads the server's current time (not the transaction's,
// which now() is), in microseconds.
const sampleQuery = `SELECT CAST(extract(epoch FROM clock_timestamp()) * 1000000 AS BIGINT)`

// Clock is the database server's clock, as this process can best know it.
type Clock struct {
	db    *sql.DB
	local func() time.Time
	// injected: local is a test's clock, not time.Now. Such a clock is
	// sampled once: sampling again would undo the jumps the test makes it
	// take, which are what it tests.
	injected bool

	mu       sync.Mutex
	dbAt     time.Time // the server's time at the last sample
	localAt  time.Time // local() at the same moment
	sampled  bool
	sampling bool
	nextTry  time.Time // by time.Now, when to sample next
}

// New returns the clock of db's server, sampled once now (bounded by
// SampleTimeout). local is the process's clock, nil for time.Now. If the
// server cannot be reached, the clock runs on local until a sample
// succeeds.
func New(db *sql.DB, local func() time.Time) *Clock {
	c := &Clock{db: db, local: local, injected: local != nil}
	if c.local == nil {
		c.local = time.Now
	}
	c.localAt = c.local()
	c.dbAt = c.localAt
	ctx, cancel := context.WithTimeout(context.Background(), SampleTimeout)
	defer cancel()
	c.sample(ctx)
	return c
}

// Now is the server's time now: its time at the last sample plus what
// elapsed since by local (by the monotonic clock, for time.Now).
func (c *Clock) Now() time.Time {
	l := c.local()
	c.mu.Lock()
	now := c.dbAt.Add(l.Sub(c.localAt))
	refresh := !c.sampling && (!c.sampled || !c.injected) && !time.Now().Before(c.nextTry)
	if refresh {
		c.sampling = true
	}
	c.mu.Unlock()
	if refresh {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), SampleTimeout)
			defer cancel()
			c.sample(ctx)
		}()
	}
	return now
}

// sample reads the server's clock and takes it as the new anchor, placed
// halfway through the round trip.
func (c *Clock) sample(ctx context.Context) {
	t0 := c.local()
	var us int64
	err := c.db.QueryRowContext(ctx, sampleQuery).Scan(&us)
	t1 := c.local()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sampling = false
	if err != nil {
		c.nextTry = time.Now().Add(RetryEvery)
		return
	}
	c.dbAt, c.localAt, c.sampled = time.UnixMicro(us), t0.Add(t1.Sub(t0)/2), true
	if off := c.dbAt.Sub(c.localAt); c.injected && off < InjectedTolerance && off > -InjectedTolerance {
		c.dbAt = c.localAt
	}
	c.nextTry = time.Now().Add(Every)
}
