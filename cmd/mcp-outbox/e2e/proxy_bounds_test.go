package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// silentUpstream is the smallest real upstream: a shell script that
// answers initialize, refuses every other request with -32601 but
// tools/call, and never answers a tools/call. One costs a few hundred kilobytes, which lets a test
// start a thousand.
const silentUpstream = `#!/bin/sh
while IFS= read -r line; do
	id=${line#*'"id":'}
	id=${id%%[,\}]*}
	case "$line" in
	*'"method":"initialize"'*)
		printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"silent","version":"0"}}}\n' "$id"
		;;
	*'"method":"tools/call"'*) ;;
	'{"jsonrpc":"2.0","id":'*)
		# server/discover among others: a client falls back to initialize.
		printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"method not found"}}\n' "$id"
		;;
	esac
done
`

func writeSilentUpstream(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "silent.sh")
	if err := os.WriteFile(path, []byte(silentUpstream), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// lockedBuffer collects a process's stderr, to the test log too.
type lockedBuffer struct {
	t    *testing.T
	mu   sync.Mutex
	buf  strings.Builder
	url  chan string // the address the proxy serves at, once
	sent bool
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	b.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	if _, u, ok := strings.Cut(string(p), "serving MCP at "); ok && !b.sent {
		b.url <- strings.TrimSpace(strings.SplitN(u, "\n", 2)[0])
		b.sent = true
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startBoundedProxy prepares `bin proxy` in front of the silent upstream;
// with --http in args, the URL it serves at comes on stderr.url.
func startBoundedProxy(t *testing.T, db string, args ...string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	all := append([]string{"proxy", "--db", db, "--log-level", "info"}, args...)
	cmd := exec.Command(bin, append(all, "--", writeSilentUpstream(t))...)
	stderr := &lockedBuffer{t: t, url: make(chan string, 1)}
	cmd.Stderr = stderr
	return cmd, stderr
}

// callStatesIn lists the states of the calls recorded in the database.
func callStatesIn(t *testing.T, db string) string {
	t.Helper()
	sdb, err := schema.Open(context.Background(), db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	return outboxtest.CallStates(t, sdb.Read)
}

// waitState polls the database until its calls are in state want.
func waitState(t *testing.T, db, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for got := ""; ; {
		if got = callStatesIn(t, db); got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls: %q, want %q", got, want)
		}
		<-time.After(20 * time.Millisecond)
	}
}

// TestProxyShutdownSettlesCalls: SIGTERM while a forwarded call waits for
// an upstream that never answers settles it as unknown before the database
// closes, over stdio and over HTTP: no call stays in_flight and nothing is
// written to a closed database.
func TestProxyShutdownSettlesCalls(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "proxy.db")
			var args []string
			if transport == "http" {
				args = []string{"--http", "127.0.0.1:0"}
			}
			cmd, stderr := startBoundedProxy(t, db, args...)
			var ct mcp.Transport = &mcp.CommandTransport{Command: cmd}
			if transport == "http" {
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
				select {
				case u := <-stderr.url:
					ct = &mcp.StreamableClientTransport{Endpoint: u}
				case <-time.After(30 * time.Second):
					t.Fatal("the proxy did not report its address")
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).Connect(ctx, ct, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			go cs.CallTool(ctx, &mcp.CallToolParams{Name: "hang", Arguments: map[string]any{}})
			waitState(t, db, "in_flight")

			exited := make(chan error, 1)
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if transport == "http" {
				go func() { exited <- cmd.Wait() }()
			} else {
				// The transport owns the process and reaps it (when its
				// stdout ends, or at Close). That the proxy exited on
				// SIGTERM, not on the end of its stdin that Close brings,
				// shows before Close.
				go func() {
					for !processEnded(cmd.Process.Pid) {
						<-time.After(10 * time.Millisecond)
					}
					exited <- cs.Close()
				}()
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("proxy exit: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the proxy did not exit after SIGTERM")
			}
			if got := callStatesIn(t, db); got != "unknown" {
				t.Errorf("calls after SIGTERM: %q, want unknown", got)
			}
			if strings.Contains(stderr.String(), "database is closed") {
				t.Error("the proxy wrote to its database after closing it")
			}
		})
	}
}

// TestProxyCallTimeoutSubprocess: with --call-timeout, a forwarded call the
// upstream never answers is settled as unknown when the timeout passes,
// whether its client still waits (it gets an error naming the flag) or
// went away.
func TestProxyCallTimeoutSubprocess(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "proxy.db")
	cmd, _ := startBoundedProxy(t, db, "--call-timeout", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	// The client gives up at once (and says so with a cancel); the proxy
	// keeps waiting for the upstream, no longer than the timeout.
	gone, giveUp := context.WithCancel(ctx)
	started := make(chan struct{})
	go func() {
		close(started)
		cs.CallTool(gone, &mcp.CallToolParams{Name: "hang", Arguments: map[string]any{"n": 1}})
	}()
	<-started
	waitState(t, db, "in_flight")
	giveUp()
	waitState(t, db, "unknown")

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hang", Arguments: map[string]any{"n": 2}})
	if err != nil {
		t.Fatal(err)
	}
	text := ""
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	if !res.IsError || errorCodeOf(res) != "outcome_unknown" || !strings.Contains(text, "--call-timeout") {
		t.Errorf("waiting client's answer: %s %q; want an unknown outcome naming --call-timeout", errorCodeOf(res), text)
	}
	waitState(t, db, "unknown,unknown")
}

// TestProxySessionsBounded: 1,000 HTTP sessions opened and abandoned, each
// with its own upstream process, leave no more processes than
// --max-sessions at any time, none once they are idle, and the proxy's
// memory bounded. A session beyond the limit is refused with 503 and the
// client tries again, as a client polling for capacity would.
func TestProxySessionsBounded(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("opens 1,000 sessions")
	}
	const (
		total    = 1000
		limit    = 50
		workers  = 8
		idleTime = time.Second
	)
	db := filepath.Join(t.TempDir(), "proxy.db")
	cmd, stderr := startBoundedProxy(t, db, "--http", "127.0.0.1:0", "--log-level", "warn",
		"--max-sessions", strconv.Itoa(limit), "--max-sessions-per-principal", strconv.Itoa(limit),
		"--session-idle-timeout", idleTime.String())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var url string
	select {
	case url = <-stderr.url:
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy did not report its address")
	}
	pid := cmd.Process.Pid

	// Sample the proxy's children and memory while the sessions come.
	var maxChildren, maxRSS atomic.Int64
	stopSampling := sample(20*time.Millisecond, func() {
		if n := int64(childrenOf(pid)); n > maxChildren.Load() {
			maxChildren.Store(n)
		}
		if r := rssKB(pid); r > maxRSS.Load() {
			maxRSS.Store(r)
		}
	})

	var rssAt200 atomic.Int64
	opened, refused := floodSessions(t, url, total, workers, 4*time.Minute, nil, func(n int64) {
		if n == 200 {
			rssAt200.Store(rssKB(pid))
		}
	})
	stopSampling()
	rssAtEnd := rssKB(pid)

	// Idle, every session ends, and its process with it.
	for end := time.Now().Add(30 * time.Second); childrenOf(pid) > 0; {
		if time.Now().After(end) {
			t.Fatalf("%d upstream processes still running 30s after the last session", childrenOf(pid))
		}
		<-time.After(50 * time.Millisecond)
	}
	t.Logf("%d sessions opened (%d refusals while at the limit); at most %d upstream processes at once; proxy RSS %d KiB after 200 sessions, %d KiB after %d, at most %d KiB",
		opened, refused, maxChildren.Load(), rssAt200.Load(), rssAtEnd, total, maxRSS.Load())
	if opened != total {
		t.Fatalf("opened %d sessions, want %d", opened, total)
	}
	// A session counts until its process has exited.
	if got := maxChildren.Load(); got > limit {
		t.Errorf("%d upstream processes at once, want at most --max-sessions (%d)", got, limit)
	}
	if rssAtEnd > 2*rssAt200.Load()+64<<10 {
		t.Errorf("proxy RSS grew from %d KiB after 200 sessions to %d KiB after %d", rssAt200.Load(), rssAtEnd, total)
	}
}

// sample runs f every interval until the returned stop, which returns once
// f has run for the last time.
func sample(every time.Duration, f func()) (stop func()) {
	done, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			f()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); <-sampled }
}

// floodSessions opens total sessions on url from workers clients at once,
// each abandoned as soon as it is open, as clients that never end their
// sessions do. A refusal must be 503 naming --max-sessions; its client
// tries again every 20 ms, as a client polling for capacity would, until
// within has passed. onRefused (if not nil) sees each refusal's body,
// onOpened (if not nil) the count of sessions opened so far. It returns
// how many sessions were opened and how many refusals came.
func floodSessions(t *testing.T, url string, total, workers int, within time.Duration,
	onRefused func(body string), onOpened func(n int64)) (opened, refused int64) {
	t.Helper()
	var nOpened, nRefused atomic.Int64
	next := make(chan int)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	deadline := time.Now().Add(within)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				for {
					status, body, err := openSession(client, url)
					if err != nil {
						t.Error(err)
						return
					}
					if status == http.StatusOK {
						break
					}
					if status != http.StatusServiceUnavailable || !strings.Contains(body, "--max-sessions") {
						t.Errorf("refused session: %d %s", status, body)
						return
					}
					nRefused.Add(1)
					if onRefused != nil {
						onRefused(body)
					}
					if time.Now().After(deadline) {
						t.Error("no room for a session before the deadline")
						return
					}
					<-time.After(20 * time.Millisecond) // poll for room
				}
				if n := nOpened.Add(1); onOpened != nil {
					onOpened(n)
				}
			}
		}()
	}
	for i := range total {
		next <- i
	}
	close(next)
	wg.Wait()
	return nOpened.Load(), nRefused.Load()
}

// openSession opens a session over raw HTTP (initialize, then initialized)
// and abandons it, as a client that never ends its sessions does.
func openSession(client *http.Client, url string) (int, string, error) {
	post := func(session, msg string) (*http.Response, string, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(msg))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body), nil
	}
	resp, body, err := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"loop","version":"0"}}}`)
	if err != nil || resp.StatusCode != http.StatusOK {
		if err != nil {
			return 0, "", err
		}
		return resp.StatusCode, body, nil
	}
	if !strings.Contains(body, `"serverInfo"`) {
		return 0, "", fmt.Errorf("initialize: %s", body)
	}
	r2, body2, err := post(resp.Header.Get("Mcp-Session-Id"), `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if err != nil {
		return 0, "", err
	}
	switch r2.StatusCode {
	case http.StatusAccepted:
	case http.StatusNotFound:
		// Reaped already: on a loaded machine the idle timeout can pass
		// between the two requests. Opened and abandoned all the same.
	default:
		return 0, "", fmt.Errorf("initialized: %s %s", r2.Status, body2)
	}
	return http.StatusOK, body, nil
}

// childrenOf counts the processes whose parent is pid.
func childrenOf(pid int) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			n++
		}
	}
	return n
}

// rssKB is pid's resident set size in KiB.
func rssKB(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// processEnded reports whether process pid has exited: it is a zombie, or gone.
func processEnded(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] == "Z"
}

// TestProxyBoundsUsage: a bound cannot be turned off or misspelt: each bad
// value is a usage error naming its flag or variable, and --help lists the
// bounds with their variables.
func TestProxyBoundsUsage(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "never.db")
	for _, tc := range []struct {
		args []string
		vars map[string]string
		want string
	}{
		{[]string{"--call-timeout", "0s"}, nil, "--call-timeout 0s: want a positive duration"},
		{[]string{"--session-idle-timeout", "-1m"}, nil, "--session-idle-timeout -1m0s: want a positive duration"},
		{[]string{"--max-sessions", "0"}, nil, "--max-sessions 0: want a positive number"},
		{[]string{"--max-sessions-per-principal", "-3"}, nil, "--max-sessions-per-principal -3: want a positive number"},
		{nil, map[string]string{"MCP_OUTBOX_MAX_SESSIONS": "many"}, `MCP_OUTBOX_MAX_SESSIONS="many"`},
		{nil, map[string]string{"MCP_OUTBOX_CALL_TIMEOUT": "soon"}, `MCP_OUTBOX_CALL_TIMEOUT="soon"`},
	} {
		args := append(append([]string{"proxy", "--db", db}, tc.args...), "--", "true")
		r := runCLI(t, tc.vars, args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("mcp-outbox %v %v: exit %d, stderr %q; want exit 2 and %q", tc.vars, tc.args, r.code, r.stderr, tc.want)
		}
	}
	if _, err := os.Stat(db); err == nil {
		t.Error("a usage error created the database")
	}
	r := runCLI(t, nil, "proxy", "--help")
	for _, want := range []string{"-call-timeout", "MCP_OUTBOX_CALL_TIMEOUT", "-session-idle-timeout", "MCP_OUTBOX_SESSION_IDLE_TIMEOUT",
		"-max-sessions", "MCP_OUTBOX_MAX_SESSIONS", "-max-sessions-per-principal", "MCP_OUTBOX_MAX_SESSIONS_PER_PRINCIPAL",
		"capabilities.experimental.idempotency"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("proxy --help does not mention %s", want)
		}
	}
}
