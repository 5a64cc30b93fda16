package outbox

import (
	"context"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Lease renewal (PostgreSQL).
//
// On SQLite a claim's owner runs on this machine, and a dead one is known
// from /proc; the lease only covers owners that cannot be checked. On
// PostgreSQL every other replica's owner is such an owner: it is trusted
// exactly as long as its lease. So a layer on PostgreSQL renews the leases
// of its attempts that are claimed and have not reached their handler's
// first statement, every third of the lease, in one statement for all of
// them. An attempt past its first statement needs no renewal: its
// transaction holds the call's row lock until its outcome commits (see
// fence).
//
// A process that stops renewing (it died, was paused by SIGSTOP, a GC or
// a VM freeze, or lost its connection) loses its claims a lease later:
// another attempt takes them over, and the old owner, if it ever resumes,
// fails the fence (the row names another owner, or its lease passed) and
// commits nothing.

// renewLeases is the renewal statement. Its ANY($3) takes a text[]. It
// skips rows that another transaction holds locked: the transaction of
// the attempt's own outcome (a cooperating upstream's, behind the proxy,
// holds the row from its fence to its commit), which needs no renewal,
// and which the renewal must not wait for, or every other lease would
// wait with it.
const renewLeases = `
UPDATE calls SET lease_until = $1
WHERE id IN (SELECT id FROM calls
             WHERE state = 'in_flight' AND lease_until > $2 AND owner = ANY($3)
             FOR UPDATE SKIP LOCKED)`

// startRenewingLocked starts the renewal loop if the layer is on
// PostgreSQL and it is not running; l.mu is held. The loop ends when the
// layer has no attempts left.
func (l *Layer) startRenewingLocked() {
	if l.db.Dialect != schema.Postgres || l.renewing {
		return
	}
	l.renewing = true
	go l.renewLoop()
}

func (l *Layer) renewLoop() {
	every := l.opts.Lease / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for range t.C {
		owners, txs := l.renewable()
		if owners == nil {
			return
		}
		for _, p := range txs {
			l.keepAlive(p, every/2)
		}
		if len(owners) == 0 {
			continue
		}
		now := l.nowMS()
		ctx, cancel := context.WithTimeout(context.Background(), every)
		_, err := l.db.Write.ExecContext(ctx, renewLeases, now+l.opts.Lease.Milliseconds(), now, owners)
		cancel()
		if err != nil {
			// The next tick tries again; a lease that passes meanwhile is
			// lost, and its attempt fails the fence.
			l.logger.Warn("renew claim leases", "claims", len(owners), "error", err)
		}
	}
}

// renewable lists the owners whose leases need renewal and the claims'
// transactions to keep alive, or returns nil owners, ending the loop,
// when the layer has no attempts.
func (l *Layer) renewable() (owners []string, txs []*pipedTx) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.local) == 0 {
		l.renewing = false
		return nil, nil
	}
	owners = []string{}
	for _, a := range l.local {
		if a.claimed.Load() && !a.fenced.Load() {
			owners = append(owners, a.owner)
		}
		if p := a.inTx.Load(); p != nil {
			txs = append(txs, p)
		}
	}
	return owners, txs
}

// keepAlive touches a claim's transaction that has been quiet for quiet
// (keepAlive in pipe_postgres.go), on a goroutine of its own, unless a
// touch of it is still under way. The loop ticks every third of the
// lease and touches at half of that, so a handler's transaction is never
// quiet for much more than half a lease while its process runs.
func (l *Layer) keepAlive(p *pipedTx, quiet time.Duration) {
	if p.quietFor() < quiet || !p.keep.busy.CompareAndSwap(false, true) {
		return
	}
	go func() {
		if sent, err := p.touch(l.db, quiet); sent && err != nil {
			// The transaction or its connection failed: the handler's
			// next statement, or the commit, learns it.
			l.logger.Warn("keep claim's transaction alive", "error", err)
		}
	}()
}
