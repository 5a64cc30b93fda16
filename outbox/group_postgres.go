package outbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// enterOwn gives the unit a transaction of its own on a pooled
// connection. PostgreSQL runs transactions side by side and shares WAL
// flushes among concurrent commits itself, so sharing one transaction, as
// SQLite's single writer needs, would only make calls wait for each other.
// What the batch gives SQLite's units holds here too: the unit's work sits
// in a savepoint (a handler's failed statement is undone without losing
// the claim), and a unit that needs no durability commits with
// synchronous_commit off (PostgreSQL flushes its WAL in order, so a later
// durable commit makes it durable too).
//
// A unit with a deadline waits for row locks no longer than the deadline
// (lock_timeout): a claim blocked behind another attempt's transaction
// then fails as busy, like SQLite's SQLITE_BUSY, and is tried again until
// the in-flight wait ends.
func (g *groupCommit) enterOwn(ctx context.Context, durable bool, deadline time.Time) (*unit, error) {
	return g.enterOwnWith(ctx, durable, deadline, nil)
}

func (g *groupCommit) enterOwnWith(ctx context.Context, durable bool, deadline time.Time, redo func(*unit) error) (*unit, error) {
	conn, err := g.db.Write.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("take database connection: %w", err)
	}
	if redo != nil && deadline.IsZero() && (durable || g.db.Durability == schema.DurabilityNormal) {
		// Nothing to send before the first statement but BEGIN, which
		// can go with it.
		if u := g.pipedUnit(conn, durable, redo); u != nil {
			return u, nil
		}
	}
	tx, err := conn.BeginTx(context.Background(), nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("begin: %w", err)
	}
	b := &batch{conn: conn, tx: tx, durable: true, opened: g.now(), own: true, done: make(chan struct{})}
	var set []string
	if !durable && g.db.Durability != schema.DurabilityNormal {
		set = append(set, "SET LOCAL synchronous_commit = off")
		b.durable = false
	}
	if !deadline.IsZero() {
		set = append(set, "SET LOCAL lock_timeout = "+strconv.FormatInt(max(time.Until(deadline).Milliseconds(), 1), 10))
	}
	if redo == nil {
		set = append(set, "SAVEPOINT unit")
	}
	u := &unit{g: g, b: b, durable: durable, redo: redo}
	if len(set) == 0 {
		return u, nil
	}
	// One round trip: without arguments pgx sends the statements as one
	// simple query.
	if _, err := tx.ExecContext(context.Background(), strings.Join(set, "; ")); err != nil {
		b.broken = fmt.Errorf("begin unit: %w", err)
		g.finish(b)
		return nil, b.err
	}
	return u, nil
}
