package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// The monkey SIGKILLs one of the soak's processes after each random pause:
// a stdio client's server (its client starts another on its next call), the
// HTTP server (started again after a random downtime, on its address), or
// the downstream (the same). Now and then it freezes a serve process
// instead (SIGSTOP, then SIGCONT), for up to twice the claims' lease: the
// calls it holds are taken over by the other processes, and when it wakes
// the fence must stop it from committing them too. On PostgreSQL it also
// kills PostgreSQL itself, and starts it again: the serve processes must
// come back by themselves. Its pauses are the workload's rhythm, not a
// wait for anything. The workload keeps pace with it (waitKills), so that
// a soak gets as many kills per logical call on a fast machine as on a
// slow one.

type chaosMonkey struct {
	rng        *rand.Rand
	log        *chaosLog
	stdio      []*chaosStdioClient
	http       *chaosHTTPServer
	downstream *chaosDownstream

	pauseMin, pauseMax time.Duration // between kills
	// A killed HTTP server or downstream stays down up to this long. The
	// downstream's outages are kept short: what its kills are for is the
	// requests they cut (applied or not, never answered). Long or frequent
	// outages only pile up failed attempts, whose backoff (doubling to 10
	// minutes) the final drain would then have to wait out.
	httpDownMax, downstreamDownMax time.Duration
	freezeMax                      time.Duration // a frozen serve process wakes after up to this long

	// pg is the cluster of the soak's database, nil on SQLite. A share
	// pgKillP of the monkey's turns kill it, for up to pgDownMax.
	pg        *pgtest.Server
	pgKillP   float64
	pgDownMax time.Duration

	// What the monkey did; read after run returns.
	stdioKills, httpKills, downstreamKills int
	freezes, freezesPastLease              int // the second: frozen longer than the lease
	lease                                  time.Duration
	pgKills                                int
	pgDown, pgRecoverMax                   time.Duration // PostgreSQL down in all; the longest wait for /readyz after a restart

	mu     sync.Mutex
	kills  int
	killed chan struct{} // closed and replaced on every kill
}

// changed returns the channel the next kill closes. m.mu must be held.
func (m *chaosMonkey) changed() chan struct{} {
	if m.killed == nil {
		m.killed = make(chan struct{})
	}
	return m.killed
}

// count records a kill and wakes waitKills.
func (m *chaosMonkey) count(kind *int) {
	*kind++
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kills++
	close(m.changed())
	m.killed = nil
}

// waitKills waits until the monkey has killed n processes; it reports
// false if ctx ended first.
func (m *chaosMonkey) waitKills(ctx context.Context, n int) bool {
	for {
		m.mu.Lock()
		kills, ch := m.kills, m.changed()
		m.mu.Unlock()
		if kills >= n {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// between draws a duration uniform in [lo, hi].
func (m *chaosMonkey) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(m.rng.Int64N(int64(hi-lo)+1))
}

// chaosPause waits d, or less if ctx ends; it reports whether ctx is still on.
func chaosPause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// run kills until ctx ends. An error (a process that would not start
// again) ends it early.
func (m *chaosMonkey) run(ctx context.Context) error {
	for chaosPause(ctx, m.between(m.pauseMin, m.pauseMax)) {
		// Drawn only on PostgreSQL, so that a seed replays the same
		// monkey on SQLite as before.
		if m.pg != nil && m.rng.Float64() < m.pgKillP {
			if err := m.killPostgres(ctx); err != nil {
				return err
			}
			continue
		}
		switch r := m.rng.Float64(); {
		case r < 0.1:
			d := m.between(m.freezeMax/20, m.freezeMax)
			var frozen bool
			if i := m.rng.IntN(len(m.stdio) + 1); i < len(m.stdio) {
				frozen = m.stdio[i].freeze(d)
			} else {
				frozen = m.http.freeze(d)
			}
			if frozen {
				if d > m.lease {
					m.freezesPastLease++
				}
				m.count(&m.freezes)
			}
		case r < 0.45:
			if m.stdio[m.rng.IntN(len(m.stdio))].kill() {
				m.count(&m.stdioKills)
			}
		case r < 0.75:
			killed, err := killAndReap(ctx, m.http)
			if err != nil {
				return err
			}
			if killed {
				m.count(&m.httpKills)
			}
			// Restarted even when the soak just ended, so that the last
			// calls are not left without a server.
			chaosPause(ctx, m.between(0, m.httpDownMax))
			if err := m.http.start(); err != nil {
				return fmt.Errorf("start the HTTP server again: %w", err)
			}
		default:
			killed, err := killAndReap(ctx, m.downstream)
			if err != nil {
				return err
			}
			if killed {
				m.count(&m.downstreamKills)
			}
			chaosPause(ctx, m.between(0, m.downstreamDownMax))
			if err := m.downstream.start(); err != nil {
				return fmt.Errorf("start the downstream again: %w", err)
			}
		}
	}
	return nil
}

// chaosPGRecovery is how long the HTTP server may take to be ready again
// once PostgreSQL is back.
const chaosPGRecovery = 30 * time.Second

// killPostgres stops PostgreSQL at once, as a crash would (no checkpoint;
// every connection cut), and starts it again on its port after up to
// pgDownMax, even when the soak just ended. While it is down the HTTP
// server's /readyz must answer 503; once it is back, 200 again within
// chaosPGRecovery, without anyone restarting the server: its pool
// reconnects. The monkey's other victims are not touched meanwhile (it
// does one thing at a time), so the HTTP server is up for both checks.
func (m *chaosMonkey) killPostgres(ctx context.Context) error {
	down := time.Now()
	if err := m.pg.Kill(); err != nil {
		return fmt.Errorf("kill PostgreSQL: %w", err)
	}
	m.log.printf("[monkey] kill PostgreSQL (pg_ctl stop -m immediate)")
	m.count(&m.pgKills)
	if code, err := m.http.readyz(); err != nil || code != http.StatusServiceUnavailable {
		return fmt.Errorf("/readyz with PostgreSQL down: %d, %v; want 503", code, err)
	}
	chaosPause(ctx, m.between(0, m.pgDownMax))
	port := m.pg.Port
	if err := m.pg.Restart(); err != nil {
		return fmt.Errorf("start PostgreSQL again: %w", err)
	}
	if m.pg.Port != port {
		return fmt.Errorf("PostgreSQL came back on port %d, not %d, where the servers look for it", m.pg.Port, port)
	}
	up := time.Now()
	m.pgDown += up.Sub(down)
	m.log.printf("[monkey] PostgreSQL started again after %s", up.Sub(down).Round(time.Millisecond))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		code, err := m.http.readyz()
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Since(up) > chaosPGRecovery {
			return fmt.Errorf("/readyz not 200 %s after PostgreSQL came back: %d, %v", chaosPGRecovery, code, err)
		}
		<-tick.C
	}
	m.pgRecoverMax = max(m.pgRecoverMax, time.Since(up))
	return nil
}

// killAndReap kills p and waits for it to be reaped, for up to 30 s, even
// if ctx ends meanwhile: the soak may end (and stop the monkey) just after
// the SIGKILL, and the victim, which a SIGKILL always ends, must still be
// reaped before it is started again. Waiting on ctx there made the monkey
// report a failure that was only the end of the soak.
func killAndReap(ctx context.Context, p interface {
	kill(context.Context) (bool, error)
}) (bool, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return p.kill(rctx)
}
