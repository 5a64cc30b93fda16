package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	neturl "net/url"
	"path/filepath"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// store hands each side of each round a fresh database.
type store struct {
	kind string
	dir  string
	pg   *pgtest.Server
	n    int
}

func (s *store) fresh(ctx context.Context) (url, name string, err error) {
	s.n++
	if s.pg == nil {
		return filepath.Join(s.dir, fmt.Sprintf("load_%d.db", s.n)), "", nil
	}
	name = fmt.Sprintf("load_%d", s.n)
	db, err := sql.Open("pgx", s.pg.URL)
	if err != nil {
		return "", "", err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", "", err
	}
	return pgtest.WithDatabase(s.pg.URL, name), name, nil
}

// commits reads the transactions committed in database name since it was
// created, once the count stops moving: backends that exit report theirs
// as they go.
func (s *store) commits(ctx context.Context, name string) (int64, error) {
	db, err := sql.Open("pgx", s.pg.URL)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	read := func() (int64, error) {
		var n int64
		err := db.QueryRowContext(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, name).Scan(&n)
		return n, err
	}
	last, err := read()
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		n, err := read()
		if err != nil {
			return 0, err
		}
		if n == last {
			return n, nil
		}
		last = n
	}
	return last, nil
}

// cpu is the PostgreSQL cluster's CPU time so far, for a side that uses
// the database (errNoDBCPU otherwise). Only one side runs at a time, so
// the difference of two readings around its load is the database's work
// for it: its backends, and the WAL writer, checkpointer and autovacuum
// that its writes keep busy.
func (s *store) cpu(sd side) (time.Duration, error) {
	if s.pg == nil || !sd.needsDB {
		return 0, errNoDBCPU
	}
	return s.pg.CPU()
}

var errNoDBCPU = errors.New("no database of its own")

// viaProxy points a postgres:// URL at addr.
func viaProxy(u, addr string) string {
	p, err := neturl.Parse(u)
	if err != nil {
		return u
	}
	p.Host = addr
	return p.String()
}

// openStore prepares the store's databases: files in dir, or a throwaway
// PostgreSQL cluster that stop ends.
func openStore(_ context.Context, kind, dir string, logf func(string, ...any)) (st *store, stop func(), err error) {
	st = &store{kind: kind, dir: dir}
	if kind != "postgres" {
		return st, func() {}, nil
	}
	logf("starting PostgreSQL (fsync on)")
	if st.pg, err = pgtest.StartDurable(); err != nil {
		return nil, nil, err
	}
	return st, func() { _ = st.pg.Stop() }, nil
}
