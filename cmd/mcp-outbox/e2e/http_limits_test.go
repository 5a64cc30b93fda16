package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHTTPLimitsFlags: serve's connection flags and their variables reach
// its listener: a connection past --max-conns gets 503 naming it (a
// loopback client is bounded by the total only), an idle one closes after MCP_OUTBOX_CONN_IDLE_TIMEOUT, and a slow
// body to the operator page's /login form gets 408 after --body-timeout.
func TestHTTPLimitsFlags(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte("operator-token-0123456789"))
	mcpURL, _ := startHTTP(t, bin, filepath.Join(t.TempDir(), "limits.db"),
		[]string{"MCP_OUTBOX_CONN_IDLE_TIMEOUT=200ms"},
		"--admin-token-sha256", hex.EncodeToString(sum[:]), "--body-timeout", "300ms", "--max-conns", "1")
	addr := strings.TrimSuffix(strings.TrimPrefix(mcpURL, "http://"), "/mcp")
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	read := func(br *bufio.Reader) (*http.Response, string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("read the answer: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	// One connection, its headers unfinished, holds the one place.
	held, _ := dial()
	fmt.Fprintf(held, "GET /healthz HTTP/1.1\r\n")
	c, br := dial()
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	if resp, body := read(br); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "--max-conns;") {
		t.Fatalf("a second connection got %d %q, want 503 naming --max-conns", resp.StatusCode, body)
	}
	held.Close()

	// Once it closed, a connection is served, and closed when idle.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, br = dial()
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
		resp, _ := read(br)
		if resp.StatusCode == http.StatusOK {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("still %d 5s after the held connection closed", resp.StatusCode)
		}
		time.Sleep(10 * time.Millisecond) // polling, with a deadline
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatalf("the idle connection was not closed: %v", err)
	}

	c, br = dial()
	start := time.Now()
	fmt.Fprintf(c, "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\ntoken=", addr)
	resp, body := read(br)
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Fatalf("a slow body to /login got %d %q (close %v), want 408 and Connection: close", resp.StatusCode, body, resp.Close)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the slow body was answered after %v, want about 300ms", took)
	}

	for _, cmd := range []string{"serve", "proxy"} {
		r := runCLI(t, nil, cmd, "--help")
		for _, want := range []string{"-body-timeout", "MCP_OUTBOX_BODY_TIMEOUT", "-conn-idle-timeout", "MCP_OUTBOX_CONN_IDLE_TIMEOUT",
			"-max-conns", "MCP_OUTBOX_MAX_CONNS", "-max-conns-per-client", "MCP_OUTBOX_MAX_CONNS_PER_CLIENT"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("%s --help does not mention %s", cmd, want)
			}
		}
	}
}
