package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// slowExitUpstream is silentUpstream that takes 1.5 s to exit once its
// stdin closes, as a server that flushes or disconnects from something at
// exit does: less than the 2 s the proxy waits before it signals it.
const slowExitUpstream = silentUpstream + "sleep 1.5\n"

// TestProxySessionsBoundedSlowExit: HTTP sessions opened and abandoned in a
// flood, in front of an upstream that exits slowly, never leave more
// upstream processes running than --max-sessions: a session counts until
// its process has exited. A session beyond the limit is refused with 503
// naming the flag, and says how many are still ending.
func TestProxySessionsBoundedSlowExit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("floods the proxy with sessions")
	}
	const (
		total    = 60
		limit    = 10
		workers  = 8
		idleTime = 200 * time.Millisecond
	)
	script := filepath.Join(t.TempDir(), "slow-exit.sh")
	if err := os.WriteFile(script, []byte(slowExitUpstream), 0o755); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(t.TempDir(), "proxy.db")
	cmd, stderr := startBoundedProxy(t, db, "--http", "127.0.0.1:0", "--log-level", "warn",
		"--max-sessions", strconv.Itoa(limit), "--max-sessions-per-principal", strconv.Itoa(limit),
		"--session-idle-timeout", idleTime.String())
	cmd.Args[len(cmd.Args)-1] = script // instead of the silent upstream
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

	var maxChildren atomic.Int64
	stopSampling := sample(10*time.Millisecond, func() {
		if n := int64(childrenOf(pid)); n > maxChildren.Load() {
			maxChildren.Store(n)
		}
	})
	var naming atomic.Int64
	opened, refused := floodSessions(t, url, total, workers, 3*time.Minute, func(body string) {
		if strings.Contains(body, "ending") {
			naming.Add(1)
		}
	}, nil)
	for end := time.Now().Add(30 * time.Second); childrenOf(pid) > 0; {
		if time.Now().After(end) {
			t.Fatalf("%d upstream processes still running 30s after the last session", childrenOf(pid))
		}
		<-time.After(50 * time.Millisecond)
	}
	stopSampling()
	t.Logf("%d sessions opened, %d refusals (%d naming sessions still ending); at most %d upstream processes at once",
		opened, refused, naming.Load(), maxChildren.Load())
	if opened != total {
		t.Fatalf("opened %d sessions, want %d", opened, total)
	}
	if got := maxChildren.Load(); got > limit {
		t.Errorf("%d upstream processes at once, want at most --max-sessions (%d)", got, limit)
	}
	if refused == 0 || naming.Load() == 0 {
		t.Errorf("%d refusals, %d naming sessions still ending; want some of each", refused, naming.Load())
	}
}

// TestProxyShutdownAnswersCalls: SIGTERM while a call waits for an
// upstream that never answers gives the client a JSON-RPC error saying
// that the proxy stopped and naming call_status, over stdio, over HTTP in
// a session (2025-11-25), and over HTTP without one (2026-07-28).
func TestProxyShutdownAnswersCalls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, protocol string }{
		{"stdio", ""},
		{"http-session", "2025-11-25"},
		{"http-stateless", "2026-07-28"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "proxy.db")
			var args []string
			if tc.protocol != "" {
				args = []string{"--http", "127.0.0.1:0"}
			}
			cmd, stderr := startBoundedProxy(t, db, args...)
			var ct mcp.Transport = &mcp.CommandTransport{Command: cmd}
			if tc.protocol != "" {
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
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).Connect(ctx, ct,
				&mcp.ClientSessionOptions{ProtocolVersion: tc.protocol})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			answered := make(chan error, 1)
			go func() {
				params := &mcp.CallToolParams{Name: "hang", Arguments: map[string]any{}}
				params.Meta = mcp.Meta{"idempotencyKey": "k-stop"}
				_, err := cs.CallTool(ctx, params)
				answered <- err
			}()
			waitState(t, db, "in_flight")
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-answered:
				if err == nil || !strings.Contains(err.Error(), "the proxy stopped") || !strings.Contains(err.Error(), "call_status") {
					t.Errorf("the call's answer at SIGTERM: %v; want an error saying the proxy stopped, naming call_status", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no answer to the call after SIGTERM")
			}
			waitState(t, db, "unknown")
		})
	}
}
