package e2e

import (
	"bufio"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// TestServe_WaitsForPostgres: serve (with --http) and drain started while
// PostgreSQL is down do not exit. serve answers /healthz 200 and /readyz
// 503 meanwhile, and takes calls once PostgreSQL is up; drain waits within
// its --timeout and then drains.
func TestServe_WaitsForPostgres(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts PostgreSQL and servers")
	}
	srv, err := pgtest.Start()
	if err != nil {
		if pgtest.Required() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	defer srv.Stop()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}

	serve := exec.Command(bin, "serve", "--db", srv.URL, "--http", "127.0.0.1:0", "--log-level", "warn")
	serveLines := startLines(t, serve)
	waiting := waitLine(t, serveLines, "waiting for the database; ")
	readyz := strings.Fields(strings.SplitN(waiting, "; ", 2)[1])[0]
	base := strings.TrimSuffix(readyz, "readyz")
	if got := httpStatus(t, readyz); got != http.StatusServiceUnavailable {
		t.Fatalf("readyz while PostgreSQL is down: %d, want 503", got)
	}
	if got := httpStatus(t, base+"healthz"); got != http.StatusOK {
		t.Fatalf("healthz while PostgreSQL is down: %d, want 200", got)
	}
	if got := httpStatus(t, base+"mcp"); got != http.StatusServiceUnavailable {
		t.Fatalf("/mcp while PostgreSQL is down: %d, want 503", got)
	}

	fake := downstream.Start(t, nil)
	drain := exec.Command(bin, "drain", "--db", srv.URL, "--dest", paymentsDest(fake), "--timeout", "2m", "--log-level", "warn")
	drainLines := startLines(t, drain)
	waitLine(t, drainLines, "database unavailable; waiting for it")

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	u := strings.TrimSpace(strings.SplitN(waitLine(t, serveLines, "serving MCP at "), "serving MCP at ", 2)[1])
	deadline := time.Now().Add(30 * time.Second)
	for httpStatus(t, readyz) != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("readyz not 200 30 s after PostgreSQL came up")
		}
		time.Sleep(50 * time.Millisecond) // polling a probe, as a load balancer does
	}
	cs := connectHTTP(t, u, "", httpClient(t, ""))
	mustSucceed(t, cs, chargeCall("k-after-wait", 100))

	done := make(chan error, 1)
	go func() { done <- drain.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("drain after PostgreSQL came up: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("drain did not finish")
	}
}

// startLines starts cmd and sends its stderr's lines to the returned
// channel (and the test log). The process is killed at cleanup.
func startLines(t *testing.T, cmd *exec.Cmd) <-chan string {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log(sc.Text())
			select {
			case lines <- sc.Text():
			default: // nobody reads any more
			}
		}
	}()
	return lines
}

// waitLine returns the first line containing want, failing the test if
// the process ends or 60 s pass first.
func waitLine(t *testing.T, lines <-chan string, want string) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the process ended before saying %q", want)
			}
			if strings.Contains(l, want) {
				return l
			}
		case <-timeout:
			t.Fatalf("no line with %q in 60 s", want)
		}
	}
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
