package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The soak's MCP servers and the clients in front of them. Over stdio each
// client owns its `serve` process and, as the spec tells stdio clients,
// starts a new one when it dies. Over Streamable HTTP the clients share
// one `serve --http` process, which the monkey starts again after killing
// it. Every process works on the same database (an SQLite file, or a
// PostgreSQL database) and delivers to the same downstream.

// chaosServe is how every serve process of the soak is started.
type chaosServe struct {
	binary string
	db     string
	dest   string   // --dest value
	env    []string // added to the environment
	lease  time.Duration
	log    *chaosLog
}

func (s chaosServe) command(extra ...string) *exec.Cmd {
	args := append([]string{"serve", "--db", s.db, "--log-level", "warn", "--dest", s.dest, "--lease", s.lease.String()}, extra...)
	cmd := exec.Command(s.binary, args...)
	cmd.Env = append(os.Environ(), s.env...)
	return cmd
}

// chaosClient makes tool calls to one server, handling its sessions: a
// call that fails because the server died leaves the client to connect
// again on its next call.
type chaosClient interface {
	name() string
	call(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error)
	close()
}

// errChaosClosed is the error of a call after the soak closed the client.
var errChaosClosed = errors.New("client closed")

// chaosStdioClient is a client with its own serve process on stdio.
type chaosStdioClient struct {
	id    string
	serve chaosServe

	mu       sync.Mutex
	cur      *chaosStdioServer // nil until the next call starts one
	starts   int
	closed   bool
	restarts int // servers started after the first
}

// chaosStdioServer is one serve process and the session to it.
type chaosStdioServer struct {
	cs   *mcp.ClientSession
	cmd  *exec.Cmd
	dead chan struct{} // closed when the session ends: the process died
}

func (c *chaosStdioClient) name() string { return c.id }

// session returns the running server, or starts one when there is none or
// it died. Other calls wait for the start: they need the server too.
func (c *chaosStdioClient) session() (*chaosStdioServer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errChaosClosed
	}
	if c.cur != nil {
		select {
		case <-c.cur.dead:
			c.cur.cs.Close() // reaps the process
			c.cur = nil
		default:
			return c.cur, nil
		}
	}
	c.starts++
	if c.starts > 1 {
		c.restarts++
	}
	cmd := c.serve.command()
	cmd.Stderr = newChaosLineWriter(c.serve.log, fmt.Sprintf("%s#%d", c.id, c.starts), "")
	client := mcp.NewClient(&mcp.Implementation{Name: "chaos-" + c.id, Version: "v0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, fmt.Errorf("start serve on stdio: %w", err)
	}
	s := &chaosStdioServer{cs: cs, cmd: cmd, dead: make(chan struct{})}
	go func() {
		cs.Wait()
		close(s.dead)
	}()
	c.cur = s
	return s, nil
}

func (c *chaosStdioClient) call(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	s, err := c.session()
	if err != nil {
		return nil, err
	}
	res, err := s.cs.CallTool(ctx, p)
	if err != nil && ctx.Err() == nil {
		// Not our timeout: the server died, or the session broke. The
		// session ends a moment after the process; a session that does
		// not is broken in some other way, and the client restarts the
		// server as it would a dead one.
		t := time.NewTimer(2 * time.Second)
		select {
		case <-s.dead:
		case <-t.C:
			err = fmt.Errorf("%w (the server is alive: restarting it)", err)
			s.cmd.Process.Kill()
		}
		t.Stop()
	}
	return res, err
}

// kill SIGKILLs the client's server, if one is running, and reports
// whether it did.
func (c *chaosStdioClient) kill() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || c.cur.cmd.Process == nil {
		return false
	}
	select {
	case <-c.cur.dead:
		return false
	default:
	}
	if err := c.cur.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false
	}
	c.serve.log.printf("[monkey] SIGKILL %s#%d (pid %d)", c.id, c.starts, c.cur.cmd.Process.Pid)
	return true
}

// freeze stops the client's server with SIGSTOP for d, then lets it go on
// with SIGCONT, and reports whether there was a server to freeze.
func (c *chaosStdioClient) freeze(d time.Duration) bool {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s == nil {
		return false
	}
	select {
	case <-s.dead:
		return false
	default:
	}
	return freezeProcess(c.serve.log, fmt.Sprintf("%s (pid %d)", c.id, s.cmd.Process.Pid), s.cmd.Process, d)
}

// freezeProcess stops p for d. The pause is the monkey's: the frozen
// process is the workload, and nothing waits for it.
func freezeProcess(log *chaosLog, name string, p *os.Process, d time.Duration) bool {
	if p.Signal(syscall.SIGSTOP) != nil {
		return false // it died meanwhile
	}
	log.printf("[monkey] SIGSTOP %s for %s", name, d)
	t := time.NewTimer(d)
	<-t.C
	p.Signal(syscall.SIGCONT)
	log.printf("[monkey] SIGCONT %s", name)
	return true
}

// close kills the running server, reaps it, and refuses further calls.
func (c *chaosStdioClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.cur != nil {
		c.cur.cmd.Process.Signal(syscall.SIGKILL)
		c.cur.cs.Close()
		c.cur = nil
	}
}

// chaosHTTPServer supervises the one `serve --http` process. Its address stays
// the same across restarts, as a deployed server's would.
type chaosHTTPServer struct {
	serve chaosServe

	mu      sync.Mutex
	addr    string // host:port; "" before the first start
	url     string // the /mcp endpoint; "" while down
	p       *chaosProc
	starts  int
	closed  bool
	changed chan struct{} // closed and replaced when url changes
}

func newChaosHTTPServer(serve chaosServe) (*chaosHTTPServer, error) {
	s := &chaosHTTPServer{serve: serve, addr: "127.0.0.1:0", changed: make(chan struct{})}
	return s, s.start()
}

// start starts the server on its address, or on a free port when that
// is taken (clients find the new URL through endpoint).
func (s *chaosHTTPServer) start() error {
	s.mu.Lock()
	s.starts++
	name := fmt.Sprintf("http#%d", s.starts)
	addr := s.addr
	s.mu.Unlock()
	p, url, err := s.startOn(name, addr)
	if err != nil && addr != "127.0.0.1:0" {
		s.serve.log.printf("[harness] %s: %v; on a free port instead", name, err)
		p, url, err = s.startOn(name, "127.0.0.1:0")
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.p, s.url = p, url
	s.addr = strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp")
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

func (s *chaosHTTPServer) startOn(name, addr string) (*chaosProc, string, error) {
	cmd := s.serve.command("--http", addr)
	out := newChaosLineWriter(s.serve.log, name, "serving MCP at ")
	cmd.Stderr = out
	return startChaosProc(cmd, out, 30*time.Second)
}

// kill marks the server down, so that clients wait for it rather than
// hammer a closed port, and SIGKILLs it.
func (s *chaosHTTPServer) kill(ctx context.Context) (bool, error) {
	s.mu.Lock()
	p := s.p
	s.url = ""
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	killed, err := p.kill(ctx)
	if killed {
		s.serve.log.printf("[monkey] SIGKILL http#%d (pid %d)", s.starts, p.cmd.Process.Pid)
	}
	return killed, err
}

// freeze stops the server with SIGSTOP for d, then SIGCONT.
func (s *chaosHTTPServer) freeze(d time.Duration) bool {
	s.mu.Lock()
	p := s.p
	s.mu.Unlock()
	return freezeProcess(s.serve.log, fmt.Sprintf("http (pid %d)", p.cmd.Process.Pid), p.cmd.Process, d)
}

// readyz asks the server's /readyz and returns the status code.
func (s *chaosHTTPServer) readyz() (int, error) {
	s.mu.Lock()
	url := strings.TrimSuffix(s.url, "/mcp") + "/readyz"
	s.mu.Unlock()
	if url == "/readyz" {
		return 0, errors.New("the HTTP server is down")
	}
	// More than the 5 s the server gives its readiness check.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Close = true // no idle connection left behind
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// endpoint waits until the server is up and returns its URL.
func (s *chaosHTTPServer) endpoint(ctx context.Context) (string, error) {
	for {
		s.mu.Lock()
		url, changed, closed := s.url, s.changed, s.closed
		s.mu.Unlock()
		switch {
		case closed:
			return "", errChaosClosed
		case url != "":
			return url, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return "", fmt.Errorf("wait for the HTTP server: %w", ctx.Err())
		}
	}
}

func (s *chaosHTTPServer) close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	p := s.p
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	_, err := p.kill(ctx)
	return err
}

// chaosHTTPClient is a client of the HTTP server: stateful (protocol
// 2025-11-25, with a session) or stateless (2026-07-28).
type chaosHTTPClient struct {
	id      string
	version string // "" for the SDK's default, stateless
	srv     *chaosHTTPServer
	hc      *http.Client

	mu       sync.Mutex
	cs       *mcp.ClientSession
	closed   bool
	connects int
}

func newChaosHTTPClient(id, version string, srv *chaosHTTPServer) *chaosHTTPClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &chaosHTTPClient{id: id, version: version, srv: srv, hc: &http.Client{Transport: tr}}
}

func (c *chaosHTTPClient) name() string { return c.id }

// session returns the client's session, connecting when there is none.
// Other calls wait for the connection: they need it too.
func (c *chaosHTTPClient) session(ctx context.Context) (*mcp.ClientSession, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errChaosClosed
	}
	if c.cs != nil {
		return c.cs, nil
	}
	url, err := c.srv.endpoint(ctx)
	if err != nil {
		return nil, err
	}
	c.connects++
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "chaos-" + c.id, Version: "v0"}, nil)
	cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: c.hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: c.version})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	c.cs = cs
	return cs, nil
}

func (c *chaosHTTPClient) call(ctx context.Context, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	cs, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	res, err := cs.CallTool(ctx, p)
	if err != nil && ctx.Err() == nil {
		// The server died or forgot the session: connect again next time.
		c.mu.Lock()
		mine := c.cs == cs
		if mine {
			c.cs = nil
		}
		c.mu.Unlock()
		if mine {
			cs.Close()
		}
	}
	return res, err
}

func (c *chaosHTTPClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.cs != nil {
		c.cs.Close()
		c.cs = nil
	}
	c.hc.CloseIdleConnections()
}
