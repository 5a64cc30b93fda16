package outbox_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/query"
)

// TestStatus_EffectErrorsForClients: call_status tells a client what
// happened to an effect in the layer's words, never the transport's text,
// which names the destination's host and port (issue 37, point 7). The
// operator's view (query, as the page and `mcp-outbox status` read it)
// keeps the full error.
func TestStatus_EffectErrorsForClients(t *testing.T) {
	t.Parallel()

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		// A port nothing listens on: the dial is refused at once.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, port, _ := net.SplitHostPort(addr)

		b, clk := setupCharged(t, "unreachable")
		d := newStatusDispatcher(t, b, clk, "http://"+addr, 3)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- d.Run(ctx) }()
		// The clock stands still, so the failed attempt's retry never
		// comes due: the effect stays pending with one attempt.
		full := waitEffect(t, b, "unreachable", func(e query.EffectStatus) bool { return e.Attempts >= 1 && e.State == "pending" })
		cancel()
		if err := <-ran; err != nil && err != context.Canceled {
			t.Fatal(err)
		}
		if !strings.Contains(full.LastError, "127.0.0.1") {
			t.Fatalf("operator's view: %q, want the transport's full error", full.LastError)
		}

		text, st := statusText(t, b, "unreachable")
		for _, bad := range []string{"127.0.0.1", ":" + port, "dial tcp", "connection refused"} {
			if strings.Contains(text, bad) {
				t.Errorf("call_status shows %q to the client", bad)
			}
		}
		if got := st.Effects[0].LastError; !strings.Contains(got, "not sent") || !strings.Contains(got, "will retry at") {
			t.Errorf("lastError %q: want not sent, will retry at", got)
		}
		if t.Failed() {
			t.Logf("call_status answered: %s", text)
		}
	})

	t.Run("ServerError", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "upstream db-7.internal:5432 is down", http.StatusInternalServerError)
		}))
		t.Cleanup(srv.Close)

		b, clk := setupCharged(t, "five-hundred")
		d := newStatusDispatcher(t, b, clk, srv.URL, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := d.Drain(ctx, nil); err != nil {
			t.Fatal(err)
		}
		text, st := statusText(t, b, "five-hundred")
		if strings.Contains(text, "127.0.0.1") || strings.Contains(text, "internal") {
			t.Errorf("call_status shows the destination's address or text: %s", text)
		}
		got := st.Effects[0]
		if got.State != "dead" || !strings.Contains(got.LastError, "the destination answered HTTP 500") ||
			!strings.Contains(got.LastError, "given up") {
			t.Errorf("effect %+v: want dead, the destination answered HTTP 500, given up", got)
		}
	})
}

// setupCharged is a layer with one committed charge under key: one effect
// to "payments".
func setupCharged(t *testing.T, key string) (*bundle, *clock) {
	t.Helper()
	clk := &clock{t: time.Now()}
	b := setup(t, &outbox.Options{Now: clk.Now}, nil)
	if res := callCharge(t, b.session, key, 100); res.IsError {
		t.Fatal(text(res))
	}
	return b, clk
}

func newStatusDispatcher(t *testing.T, b *bundle, clk *clock, target string, attempts int) *dispatch.Dispatcher {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatch.New(b.db, &dispatch.Options{
		Destinations: []dispatch.Destination{{Name: "payments", URL: u, MaxAttempts: attempts}},
		Now:          clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// waitEffect polls the operator's view of key's only effect until ok.
func waitEffect(t *testing.T, b *bundle, key string, ok func(query.EffectStatus) bool) query.EffectStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := query.Lookup(context.Background(), b.db, callkey.LocalPrincipal, key, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Effects) == 1 && ok(st.Effects[0]) {
			return st.Effects[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("effect of %s: %+v", key, st.Effects)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// statusText is what call_status answers a client for key: all of its
// text content, and the structured status.
func statusText(t *testing.T, b *bundle, key string) (string, query.Status) {
	t.Helper()
	res := call(t, b.session, outbox.StatusToolName, "", map[string]any{"key": key})
	if res.IsError {
		t.Fatal(text(res))
	}
	structured, _ := json.Marshal(res.StructuredContent)
	var st query.Status
	if err := json.Unmarshal(structured, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Effects) != 1 {
		t.Fatalf("effects: %+v", st.Effects)
	}
	return text(res) + string(structured), st
}

// TestStatus_DatabaseFaultForClients: a lookup the database fails answers
// the client with an error id, never the driver's text; the log has that
// text under the id.
func TestStatus_DatabaseFaultForClients(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	b := setup(t, &outbox.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil)
	callCharge(t, b.session, "paid", 100)
	if _, err := b.db.Write.Exec(`ALTER TABLE calls RENAME TO calls_elsewhere`); err != nil {
		t.Fatal(err)
	}
	res := call(t, b.session, outbox.StatusToolName, "", map[string]any{"key": "paid"})
	got := text(res)
	m := regexp.MustCompile(`error_id=([0-9a-f]{8})`).FindStringSubmatch(got)
	if !res.IsError || m == nil || strings.Contains(got, "calls") {
		t.Fatalf("call_status on a broken database: %q, want an error id and not the driver's text", got)
	}
	if line := grepLine(logs.String(), "error_id="+m[1]); !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "calls") {
		t.Errorf("log line for %s: %q, want the driver's error at ERROR", m[1], line)
	}
	// The client's own mistakes are still the client's to read.
	if res := call(t, b.session, outbox.StatusToolName, "", map[string]any{"key": "a\u202eb"}); !res.IsError || !strings.Contains(text(res), "not printable") {
		t.Errorf("bad key: %s", text(res))
	}
}

func grepLine(s, sub string) string {
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// syncBuffer is a log destination several goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
