package outbox

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCache holds statements prepared on the writer connection. Parsing SQL
// costs modernc's SQLite about a sixth of a call's CPU time (measured with
// BenchmarkChargeConcurrent's profile), and the same few statements run on
// every call, so units run them prepared.
//
// A statement can only be prepared for database/sql's DB when the writer
// connection is free, never while a batch holds it: a statement seen for the
// first time runs unprepared and is prepared when the next batch opens.
// Through Tx.StmtContext a statement prepared for the DB runs inside a
// batch's transaction without another parse.
//
// Only statements whose rows are read at once (Exec, QueryRow) use the
// cache: modernc resets a prepared statement when it runs again, which would
// cut short Rows a handler is still reading.
type stmtCache struct {
	db *sql.DB

	mu      sync.Mutex
	stmts   map[string]*sql.Stmt // nil: could not be prepared, runs unprepared
	pending map[string]bool      // seen, to prepare when the writer is free
}

// maxCachedStmts bounds the cache: a handler that builds its SQL text per
// call would otherwise grow it without end.
const maxCachedStmts = 256

// newStmtCache returns a cache, or nil when on is false: pgx keeps a
// cache of prepared statements per connection itself (PostgreSQL), and a
// statement prepared for database/sql's pool would be prepared again on
// each connection a transaction takes.
func newStmtCache(db *sql.DB, on bool) *stmtCache {
	if !on {
		return nil
	}
	return &stmtCache{db: db, stmts: map[string]*sql.Stmt{}, pending: map[string]bool{}}
}

// lookup returns the prepared statement of query, or nil, noting query for
// preparing.
func (c *stmtCache) lookup(query string) *sql.Stmt {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.stmts[query]
	if !ok && !c.pending[query] && len(c.stmts)+len(c.pending) < maxCachedStmts {
		c.pending[query] = true
	}
	return st
}

// prepare prepares the statements noted since the last call. The caller
// must not hold the writer connection.
func (c *stmtCache) prepare(ctx context.Context) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if len(c.pending) == 0 {
		c.mu.Unlock()
		return
	}
	queries := make([]string, 0, len(c.pending))
	for q := range c.pending {
		queries = append(queries, q)
	}
	c.mu.Unlock()
	for _, q := range queries {
		st, err := c.db.PrepareContext(ctx, q)
		if err != nil && ctx.Err() != nil {
			return // the caller gave up; try again at the next batch
		}
		if err != nil {
			// A statement that does not prepare (a handler's syntax error)
			// keeps running unprepared and reports its error each time.
			st = nil
		}
		c.mu.Lock()
		delete(c.pending, q)
		c.stmts[q] = st
		c.mu.Unlock()
	}
}
