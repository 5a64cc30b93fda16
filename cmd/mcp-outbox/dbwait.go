package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Waits between attempts to open a database that is unavailable: doubling
// from dbWaitFirst up to dbWaitLast.
const (
	dbWaitFirst = 250 * time.Millisecond
	dbWaitLast  = 10 * time.Second
)

// openWaiting opens the database, waiting for it, with backoff, for as
// long as it is unavailable (schema.ErrUnavailable: PostgreSQL not up yet,
// restarting, refusing connections), until ctx ends. A server and its
// database often start together (a compose file, a pod, a machine's boot),
// and a server that exited on the first refused connection would need a
// restart policy to come up at all. Any other error (a wrong URL or
// password, a newer schema) is returned at once: waiting cannot fix it.
func openWaiting(ctx context.Context, target string, opts *schema.Options, logger *slog.Logger, waiting func()) (*schema.DB, error) {
	// A new SQLite file is what a first run wants, and what a mistyped
	// --db gets: every earlier key forgotten, every retry run again. So
	// a new file is said.
	_, statErr := os.Stat(target)
	created := !schema.IsPostgresURL(target) && errors.Is(statErr, os.ErrNotExist)
	wait := dbWaitFirst
	for attempt := 1; ; attempt++ {
		db, err := schema.Open(ctx, target, opts)
		if err == nil || !errors.Is(err, schema.ErrUnavailable) {
			if err == nil && attempt > 1 {
				logger.Info("database is up", "db", schema.Redact(target), "attempts", attempt)
			}
			if err == nil && created {
				logger.Info("created a new database: no call was recorded in it before (if you meant an existing one, check --db)",
					"db", target)
			}
			return db, err
		}
		if attempt == 1 && waiting != nil {
			waiting()
		}
		logger.Warn("database unavailable; waiting for it", "db", schema.Redact(target), "attempt", attempt, "retry_in", wait, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("gave up waiting for the database: %w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, dbWaitLast)
	}
}

// earlyHTTP serves --http from before the database is open, so that a
// server waiting for its database answers its health checks meanwhile:
// healthz 200 (the process runs), readyz 503 (do not route calls here),
// anything else 503 with Retry-After. Once the database is open, the real
// handler takes over on the same listener and server.
//
// Only a store that can be down (PostgreSQL) gets that window: a local
// SQLite file opens at once or fails, and a client that connected right
// after launch was refused with 503 for nothing. So with SQLite it listens
// only in serve, with the real handler, once the database is open and
// migrated.
type earlyHTTP struct {
	ctx    context.Context // the server ends with it
	addr   string
	opts   mcphttp.Options
	ln     net.Listener // nil until it listens
	h      atomic.Pointer[http.Handler]
	served chan error
	cancel context.CancelFunc
	once   sync.Once
	err    error // the server's end, once waited for
}

// listenEarly prepares serving addr for serve and proxy with --http; nil
// without. With PostgreSQL it listens at once, before the database opens,
// and once the database turns out to be unavailable it says where the
// health checks are; with SQLite it listens in serve (see earlyHTTP).
// It makes cfg's logger, which the shutdown's log needs.
func listenEarly(ctx context.Context, env *environment, cfg *appConfig, ac *authConfig, addr string) (*earlyHTTP, error) {
	if addr == "" {
		return nil, nil
	}
	if cfg.shutdownTimeout < 0 {
		return nil, usagef("--shutdown-timeout %v: must not be negative", cfg.shutdownTimeout)
	}
	if cfg.logger == nil {
		logger, err := newLogger(env.stderr, cfg.logLevel, cfg.logFormat)
		if err != nil {
			return nil, err
		}
		cfg.logger = logger
	}
	e := &earlyHTTP{ctx: ctx, addr: addr, opts: mcphttp.Options{Logger: cfg.logger, ShutdownTimeout: cfg.shutdownTimeout}}
	cfg.httpLimits.apply(&e.opts)
	if !schema.IsPostgresURL(cfg.db) {
		return e, nil
	}
	base := ac.operatorBase()
	if err := e.listen(waitingHandler(base)); err != nil {
		return nil, err
	}
	cfg.dbWaiting = func() {
		fmt.Fprintf(env.stderr, "mcp-outbox: waiting for the database; http://%s%sreadyz answers 503 until it opens\n", e.ln.Addr(), base)
	}
	return e, nil
}

// listen listens on e.addr and serves h until e.ctx ends.
func (e *earlyHTTP) listen(h http.Handler) error {
	ln, err := net.Listen("tcp", e.addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", e.addr, err)
	}
	sctx, cancel := context.WithCancel(e.ctx)
	e.ln, e.served, e.cancel = ln, make(chan error, 1), cancel
	e.h.Store(&h)
	go func() { e.served <- mcphttp.ServeWith(sctx, ln, e, &e.opts) }()
	return nil
}

func (e *earlyHTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) { (*e.h.Load()).ServeHTTP(w, r) }

// use hands the listener to h: requests from now on go to it. If e does not
// listen yet (SQLite), it listens now, with h from the first request.
func (e *earlyHTTP) use(h http.Handler) error {
	if e.ln == nil {
		return e.listen(h)
	}
	e.h.Store(&h)
	return nil
}

// wait waits until the server ends (with the ctx of listenEarly).
func (e *earlyHTTP) wait() error {
	e.once.Do(func() { e.err = <-e.served })
	return e.err
}

// abort ends the server if it still runs: the command fails before
// serving. It does nothing on nil, before listening, or once the server
// ended.
func (e *earlyHTTP) abort() {
	if e == nil || e.ln == nil {
		return
	}
	e.cancel()
	e.once.Do(func() { e.err = <-e.served })
}

// waitingHandler answers while the database is not open yet.
func waitingHandler(base string) http.Handler {
	base = "/" + strings.Trim(base, "/")
	if base != "/" {
		base += "/"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case base + "healthz":
			io.WriteString(w, "ok\n")
			return
		case base + "readyz":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]any{"ready": false, "status": "unavailable",
				"checks": map[string]string{"database": "waiting for the database to come up: see the server's log"}})
			return
		}
		w.Header().Set("Retry-After", "1")
		http.Error(w, "mcp-outbox is starting: waiting for its database", http.StatusServiceUnavailable)
	})
}
