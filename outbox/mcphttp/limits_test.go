package mcphttp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// serveLimits serves h through ServeWith on 127.0.0.1 until the test ends,
// and returns its address.
func serveLimits(t *testing.T, h http.Handler, opts *Options) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeWith(ctx, ln, h, opts) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ServeWith: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawConn is a client that writes what it likes and reads answers.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string, local string) *rawConn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{Conn: c, br: bufio.NewReader(c)}
}

// get sends a GET and reads its answer, within 5 s.
func (c *rawConn) get(t *testing.T, path string) (*http.Response, string) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	return c.read(t)
}

func (c *rawConn) read(t *testing.T) (*http.Response, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer's body: %v", err)
	}
	return resp, string(b)
}

// waitClosed waits until the server closed c, within 5 s.
func (c *rawConn) waitClosed(t *testing.T) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c.br); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		// A reset is a close too: the client sent what the server did
		// not read.
		t.Fatalf("the server did not close the connection: %v", err)
	}
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })

// TestServeWith_SlowBody: a client that declares a body and trickles it
// gets 408 and a closed connection within the bound, whichever handler
// reads the body and whatever it answers an unreadable body with. Before,
// it was never answered.
func TestServeWith_SlowBody(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	handlers := map[string]struct {
		h           http.Handler
		contentType string
	}{
		// The /mcp endpoint: LiftParamsKey reads the body first.
		"MCP": {NewHandler(mcp.NewServer(&mcp.Implementation{Name: "t", Version: "1"}, nil), nil), "application/json"},
		"Form": {http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := r.ParseForm(); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			io.WriteString(w, "ok")
		}), "application/x-www-form-urlencoded"},
		"JSON": {http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var v any
			if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
				return
			}
			io.WriteString(w, "ok")
		}), "application/json"},
		"Silent": {http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body) // and answers nothing
		}), "application/octet-stream"},
	}
	for name, tc := range handlers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			addr := serveLimits(t, tc.h, &Options{BodyTimeout: bound})
			c := dialRaw(t, addr, "")
			start := time.Now()
			fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n{", tc.contentType)
			trickle := time.NewTicker(bound / 6)
			defer trickle.Stop()
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-trickle.C:
						if _, err := c.Write([]byte(" ")); err != nil {
							return
						}
					}
				}
			}()
			resp, body := c.read(t)
			took := time.Since(start)
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Fatalf("status %d %q, want 408", resp.StatusCode, body)
			}
			if !resp.Close {
				t.Errorf("headers %v, want Connection: close", resp.Header)
			}
			if !strings.Contains(body, "request body not received within 300ms") {
				t.Errorf("body %q, want the bound named", body)
			}
			if took < bound || took > bound+2*time.Second {
				t.Errorf("answered after %v, want just after the bound %v", took, bound)
			}
			c.waitClosed(t)
		})
	}
}

// TestServeWith_BodyBoundEndsWithBody: once the body was read, the bound no
// longer applies: an answer that takes longer than it is not cut, and the
// request's context does not end (as http.Server.ReadTimeout would make
// it: net/http's background read hits the deadline).
func TestServeWith_BodyBoundEndsWithBody(t *testing.T) {
	t.Parallel()
	const bound = 100 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
			// The client never sees this: its connection is gone.
			return
		case <-time.After(5 * bound): // the answer takes longer than the bound
		}
		io.WriteString(w, "data: late\n\n")
	})
	addr := serveLimits(t, h, &Options{BodyTimeout: bound, IdleTimeout: bound})
	c := dialRaw(t, addr, "")
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	resp, body := c.read(t)
	if resp.StatusCode != http.StatusOK || body != "data: late\n\n" {
		t.Fatalf("got %d %q, want 200 and the late event", resp.StatusCode, body)
	}
	// The connection carries the next request: the deadline is gone.
	if resp, body := c.get(t, "/"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the next request got %d %q", resp.StatusCode, body)
	}
}

// TestServeWith_IdleConnClosed: a keep-alive connection with no request is
// closed after IdleTimeout. Before, it stayed open for ever.
func TestServeWith_IdleConnClosed(t *testing.T) {
	t.Parallel()
	addr := serveLimits(t, ok, &Options{IdleTimeout: 100 * time.Millisecond})
	c := dialRaw(t, addr, "")
	if resp, _ := c.get(t, "/healthz"); resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("got %d, close %v; want 200 kept alive", resp.StatusCode, resp.Close)
	}
	c.waitClosed(t)
}

// TestServeWith_StreamOutlivesBounds: an event stream that sends nothing
// for longer than the idle and body bounds is not idle, and is not cut.
func TestServeWith_StreamOutlivesBounds(t *testing.T) {
	t.Parallel()
	const bound = 50 * time.Millisecond
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-time.After(10 * bound):
		}
		io.WriteString(w, "data: late\n\n")
	})
	addr := serveLimits(t, h, &Options{BodyTimeout: bound, IdleTimeout: bound})
	c := dialRaw(t, addr, "")
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
	resp, body := c.read(t)
	if resp.StatusCode != http.StatusOK || body != "data: late\n\n" {
		t.Fatalf("got %d %q, want 200 and the late event", resp.StatusCode, body)
	}
}

// TestServeWith_SessionStreamOutlivesBounds: go-sdk's standalone stream of
// a session (its client's GET) carries a notification sent after the
// bounds passed several times, with a client that does not reconnect.
func TestServeWith_SessionStreamOutlivesBounds(t *testing.T) {
	t.Parallel()
	const bound = 50 * time.Millisecond
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	addr := serveLimits(t, NewHandler(srv, nil), &Options{BodyTimeout: bound, IdleTimeout: bound})
	changed := make(chan struct{}, 1)
	client := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"}) // a session, with its standalone stream
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	// Let the bounds pass, on the stream (silent) and on the POSTs'
	// connections (idle).
	<-time.After(10 * bound)
	mcp.AddTool(srv, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("the session's stream did not carry tools/list_changed sent after the bounds")
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("the session after the bounds: %v", err)
	}
}

// TestServeWith_LoopbackNotBoundPerClient: a loopback peer, a reverse
// proxy or mesh sidecar on the same host that every client comes through,
// is bounded by the total only.
func TestServeWith_LoopbackNotBoundPerClient(t *testing.T) {
	t.Parallel()
	addr := serveLimits(t, ok, &Options{MaxConnsPerClient: 2, MaxConns: 4})
	for i := range 4 {
		if resp, body := dialRaw(t, addr, "").get(t, "/"); resp.StatusCode != http.StatusOK {
			t.Fatalf("loopback connection %d of 4 (per-client bound 2): %d %q", i+1, resp.StatusCode, body)
		}
	}
	if resp, body := dialRaw(t, addr, "").get(t, "/"); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "--max-conns;") {
		t.Fatalf("the fifth loopback connection (total bound 4): %d %q, want 503 naming --max-conns", resp.StatusCode, body)
	}
}

// TestServeWith_ConnLimits: past the bound on open connections, per client
// address or in total, a new connection gets 503 with Retry-After and
// the limit's name; once one closes, a new one is served again. The
// refusals are logged as a count, not a line each.
func TestServeWith_ConnLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		opts       Options
		otherAddr  bool // a connection from another address is served
		wantInBody string
	}{
		{"PerClient", Options{MaxConnsPerClient: 2, MaxConns: -1, boundLoopback: true}, true, "at most 2 open connections per client address (mcp-outbox: --max-conns-per-client; mcphttp.Options.MaxConnsPerClient)"},
		{"Total", Options{MaxConns: 2, MaxConnsPerClient: -1}, false, "at most 2 open connections (mcp-outbox: --max-conns; mcphttp.Options.MaxConns)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			opts := tc.opts
			opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			opts.refusalLogEvery = 500 * time.Millisecond
			addr := serveLimits(t, ok, &opts)
			held := []*rawConn{dialRaw(t, addr, ""), dialRaw(t, addr, "")}
			for _, c := range held {
				if resp, _ := c.get(t, "/"); resp.StatusCode != http.StatusOK {
					t.Fatalf("a connection within the bound got %d", resp.StatusCode)
				}
			}
			const refusals = 5
			for range refusals {
				c := dialRaw(t, addr, "")
				resp, body := c.get(t, "/")
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !resp.Close {
					t.Fatalf("past the bound: %d %v %q, want 503 with Retry-After and Connection: close", resp.StatusCode, resp.Header, body)
				}
				if !strings.Contains(body, tc.wantInBody) {
					t.Fatalf("past the bound: body %q, want %q", body, tc.wantInBody)
				}
				c.waitClosed(t)
			}
			if tc.otherAddr {
				c := dialRaw(t, addr, "127.0.0.2")
				if resp, body := c.get(t, "/"); resp.StatusCode != http.StatusOK {
					t.Fatalf("another client address got %d %q", resp.StatusCode, body)
				}
			}
			held[0].Close()
			// The server sees the close when it reads the connection next:
			// poll for the place coming free.
			deadline := time.Now().Add(5 * time.Second)
			for {
				c := dialRaw(t, addr, "")
				resp, _ := c.get(t, "/")
				c.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("still %d 5s after a connection closed", resp.StatusCode)
				}
				time.Sleep(10 * time.Millisecond) // polling, with a deadline
			}
			// Every refusal is in the log, in fewer lines than refusals.
			deadline = time.Now().Add(5 * time.Second)
			countRe := regexp.MustCompile(`refused=(\d+)`)
			for {
				l := logs.String()
				lines, counted := 0, 0
				for line := range strings.Lines(l) {
					if strings.Contains(line, "refusing connections past a limit") {
						lines++
						counted++
						if !strings.Contains(line, "max-conns") {
							t.Errorf("log line %q does not name the limit", line)
						}
					}
					if m := countRe.FindStringSubmatch(line); m != nil {
						lines++
						n, _ := strconv.Atoi(m[1])
						counted += n
					}
				}
				if counted >= refusals {
					if lines >= counted {
						t.Errorf("%d log lines for %d refusals, want a count:\n%s", lines, refusals, l)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("log counts %d of %d refusals:\n%s", counted, refusals, l)
				}
				time.Sleep(10 * time.Millisecond) // polling, with a deadline
			}
		})
	}
}

// TestResolveConnLimits: zero is the default, within the open-file limit;
// negative is off.
func TestResolveConnLimits(t *testing.T) {
	t.Parallel()
	wantTotal := DefaultMaxConns
	if n := openFileLimit(); n > 0 {
		wantTotal = max(min(wantTotal, n/2), 1)
	}
	for _, tc := range []struct {
		o                    Options
		wantTotal, wantPerCl int
	}{
		{Options{}, wantTotal, max(min(DefaultMaxConnsPerClient, wantTotal/4), 1)},
		{Options{MaxConns: 20}, 20, 5},
		{Options{MaxConns: 20, MaxConnsPerClient: 30}, 20, 30},
		{Options{MaxConns: -1}, 0, DefaultMaxConnsPerClient},
		{Options{MaxConns: -1, MaxConnsPerClient: -1}, 0, 0},
	} {
		total, per := resolveConnLimits(tc.o)
		if total != tc.wantTotal || per != tc.wantPerCl {
			t.Errorf("%+v: got %d, %d; want %d, %d", tc.o, total, per, tc.wantTotal, tc.wantPerCl)
		}
	}
}

// TestServeWith_ConnLimitsGoClient: a Go client past the bound gets the
// 503 as its request's answer, not an error.
func TestServeWith_ConnLimitsGoClient(t *testing.T) {
	t.Parallel()
	addr := serveLimits(t, ok, &Options{MaxConnsPerClient: 1, Logger: slog.New(slog.DiscardHandler), boundLoopback: true})
	held := dialRaw(t, addr, "")
	if resp, _ := held.get(t, "/"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the first connection got %d", resp.StatusCode)
	}
	for range 5 {
		resp, err := (&http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}).Get("http://" + addr + "/")
		if err != nil {
			t.Fatalf("past the bound: %v, want a 503 answer", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "--max-conns-per-client") {
			t.Fatalf("past the bound: %d %q", resp.StatusCode, b)
		}
	}
}

// TestNewHandler_InvalidOriginWarns: an AllowedOrigins entry that is not
// an origin (no scheme) matches no request; NewHandler, which returns no
// error, says so in the log.
func TestNewHandler_InvalidOriginWarns(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	NewHandler(mcp.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil), &Options{
		Logger:         slog.New(slog.NewTextHandler(&logs, nil)),
		AllowedOrigins: []string{"https://ok.example", "app.example.com"},
	})
	if got := logs.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, `app.example.com`) || strings.Contains(got, "ok.example") {
		t.Fatalf("log %q: want one warning, for app.example.com only", got)
	}
}
