package scenario

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	_ "modernc.org/sqlite" // the "sqlite" driver, to count the ledger's rows
)

// serveArgs is the command line of a server for this run.
func (r *run) serveArgs(delay time.Duration, extra ...string) []string {
	args := []string{"serve", "--db", r.db, "--log-level", "warn"}
	if delay > 0 {
		args = append(args, "--demo-delay", delay.String())
	}
	if r.mode == Bare {
		args = append(args, "--bare")
	}
	return append(args, extra...)
}

// command returns an unstarted server process for this run: on stdio, or
// serving Streamable HTTP when http is set.
func (r *run) command(delay time.Duration, http bool) (*exec.Cmd, error) {
	if r.cfg.Server.Command != nil {
		return r.cfg.Server.Command(r.db, r.mode, delay, http)
	}
	var extra []string
	if http {
		extra = []string{"--http", "127.0.0.1:0"}
	}
	return exec.Command(r.cfg.Binary, r.serveArgs(delay, extra...)...), nil
}

func newClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "mcp-outbox-scenario", Version: "v0"}, nil)
}

// connectStdio starts a server on stdio and connects the go-sdk client to it.
// The server is the child itself (no shell in between), so that a SIGKILL
// reaches it; closing the session closes its stdin and reaps it.
func (r *run) connectStdio(ctx context.Context, delay time.Duration) (*mcp.ClientSession, *exec.Cmd, error) {
	cmd, err := r.command(delay, false)
	if err != nil {
		return nil, nil, fmt.Errorf("start stdio server: %w", err)
	}
	cmd.Stderr = r.cfg.ServerLog
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cs, err := newClient().Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		if cmd.Process != nil {
			// The SDK closes (and so reaps) the process when the handshake
			// fails; this only speeds up a server that hangs.
			_ = cmd.Process.Kill()
		}
		return nil, nil, fmt.Errorf("start stdio server: %w", err)
	}
	r.logf("stdio server started (pid %d)", cmd.Process.Pid)
	return cs, cmd, nil
}

// httpServer is a `serve --http` process.
type httpServer struct {
	cmd    *exec.Cmd
	url    string
	exited chan struct{} // closed once the process is reaped
}

// startHTTP starts a server on Streamable HTTP at a free port and returns
// once it has printed its address.
func (r *run) startHTTP(ctx context.Context, delay time.Duration) (*httpServer, error) {
	cmd, err := r.command(delay, true)
	if err != nil {
		return nil, fmt.Errorf("start http server: %w", err)
	}
	urls := make(chan string, 1)
	cmd.Stderr = &lineWriter{out: r.cfg.ServerLog, line: func(line string) {
		if _, u, ok := strings.Cut(line, "serving MCP at "); ok {
			select {
			case urls <- strings.TrimSpace(u):
			default:
			}
		}
	}}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start http server: %w", err)
	}
	s := &httpServer{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	select {
	case s.url = <-urls:
		r.logf("http server started (pid %d) at %s", cmd.Process.Pid, s.url)
		return s, nil
	case <-s.exited:
		return nil, fmt.Errorf("start http server: exited before serving: %v", cmd.ProcessState)
	case <-t.C:
		s.stop()
		return nil, fmt.Errorf("start http server: no address printed within %v", startTimeout)
	case <-ctx.Done():
		s.stop()
		return nil, fmt.Errorf("start http server: %w", ctx.Err())
	}
}

// stop asks the server to shut down, so that calls still in progress finish
// and commit as they would in production, and kills it if it does not exit
// in time. It returns once the process is reaped.
func (s *httpServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	select {
	case <-s.exited:
		return
	case <-t.C:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// lineWriter copies a process's stderr to out and hands each line to line.
type lineWriter struct {
	out  io.Writer
	line func(string)

	mu  sync.Mutex
	buf []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	_, _ = w.out.Write(p) // a failing log must not break the server's stderr
	return len(p), nil
}

// openDB opens the run's database for reading beside a running server.
func openDB(path string) (*sql.DB, error) {
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=busy_timeout(5000)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	return db, nil
}

// countCharges counts the charges with query, which counts one row per
// actual charge.
func countCharges(ctx context.Context, path, query string) (int, error) {
	db, err := openDB(path)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(ctx, query).Scan(&n); err != nil {
		return 0, fmt.Errorf("count charges: %w", err)
	}
	return n, nil
}

// errCallEnded is returned by waitForRow when the call ended before the row
// appeared.
var errCallEnded = errors.New("the call ended before the state to wait for was reached")

// waitForRow polls the database until query returns a count above zero, the
// call ends (done is closed) or the deadline passes.
func waitForRow(ctx context.Context, path, query string, done <-chan struct{}) error {
	db, err := openDB(path)
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		var n int
		lastErr = db.QueryRowContext(ctx, query).Scan(&n)
		if lastErr == nil && n > 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-done:
			return errCallEnded
		case <-deadline.C:
			return fmt.Errorf("wait for %q: nothing within %v (last error: %v)", query, startTimeout, lastErr)
		case <-ctx.Done():
			return fmt.Errorf("wait for %q: %w", query, ctx.Err())
		}
	}
}
