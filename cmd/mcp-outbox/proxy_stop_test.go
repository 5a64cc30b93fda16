package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if n := int64(childrenOf(pid)); n > maxChildren.Load() {
				maxChildren.Store(n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	var opened, refused, naming atomic.Int64
	next := make(chan int)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	deadline := time.Now().Add(3 * time.Minute)
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
					refused.Add(1)
					if strings.Contains(body, "ending") {
						naming.Add(1)
					}
					if time.Now().After(deadline) {
						t.Error("no room for a session before the deadline")
						return
					}
					<-time.After(20 * time.Millisecond) // poll for room
				}
				opened.Add(1)
			}
		}()
	}
	for i := range total {
		next <- i
	}
	close(next)
	wg.Wait()
	for end := time.Now().Add(30 * time.Second); childrenOf(pid) > 0; {
		if time.Now().After(end) {
			t.Fatalf("%d upstream processes still running 30s after the last session", childrenOf(pid))
		}
		<-time.After(50 * time.Millisecond)
	}
	close(stop)
	<-sampled
	t.Logf("%d sessions opened, %d refusals (%d naming sessions still ending); at most %d upstream processes at once",
		opened.Load(), refused.Load(), naming.Load(), maxChildren.Load())
	if opened.Load() != total {
		t.Fatalf("opened %d sessions, want %d", opened.Load(), total)
	}
	if got := maxChildren.Load(); got > limit {
		t.Errorf("%d upstream processes at once, want at most --max-sessions (%d)", got, limit)
	}
	if refused.Load() == 0 || naming.Load() == 0 {
		t.Errorf("%d refusals, %d naming sessions still ending; want some of each", refused.Load(), naming.Load())
	}
}
