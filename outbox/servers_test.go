package outbox_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

type whoOut struct {
	Server string `json:"server"`
	Run    int    `json:"run"`
}

// addWho adds tool "who" to s: it writes a charge of amount and answers
// the server's name and how often this server's handler ran.
func addWho(l *outbox.Layer, s *mcp.Server, name string, amount int) *int {
	runs := new(int) // the in-memory calls of these tests are sequential
	outbox.AddTool(l, s, &mcp.Tool{Name: "who", Description: "test tool"},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, whoOut, error) {
			*runs++
			if _, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, amount); err != nil {
				return nil, whoOut{}, err
			}
			return nil, whoOut{Server: name, Run: *runs}, nil
		}, nil)
	return runs
}

func whoOf(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if res.IsError {
		t.Fatalf("call failed: %s", text(res))
	}
	m, _ := res.StructuredContent.(map[string]any)
	s, _ := m["server"].(string)
	return s
}

// Two servers on one layer, each with its own tool of the same name: each
// server's calls reach its own handler, and both are recorded and replayed.
// Before the registry was per server, the second AddTool took the name
// from the first server, whose every call then failed.
func TestServers_SameToolName(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	sA := l.NewServer(&mcp.Implementation{Name: "a", Version: "v0"}, nil)
	sB := l.NewServer(&mcp.Implementation{Name: "b", Version: "v0"}, nil)
	runsA := addWho(l, sA, "A", 1)
	runsB := addWho(l, sB, "B", 2)
	csA, csB := connect(t, sA), connect(t, sB)

	if got := whoOf(t, call(t, csA, "who", "a1", map[string]any{})); got != "A" {
		t.Errorf("server A's call reached %q", got)
	}
	if got := whoOf(t, call(t, csB, "who", "b1", map[string]any{})); got != "B" {
		t.Errorf("server B's call reached %q", got)
	}
	for _, c := range []struct {
		cs   *mcp.ClientSession
		key  string
		want string
	}{{csA, "a1", "A"}, {csB, "b1", "B"}} {
		res := call(t, c.cs, "who", c.key, map[string]any{})
		if got := whoOf(t, res); got != c.want || callMeta(res)["replayed"] != true {
			t.Errorf("retry of %s = %s replayed=%v, want %s's recorded result", c.key, got, callMeta(res)["replayed"], c.want)
		}
	}
	if *runsA != 1 || *runsB != 1 {
		t.Errorf("handler runs A=%d B=%d, want 1 each", *runsA, *runsB)
	}
	if got := count(t, db.Read, `SELECT count(*) FROM charges WHERE amount = 1`); got != 1 {
		t.Errorf("A's charges = %d, want 1", got)
	}
	if got := count(t, db.Read, `SELECT count(*) FROM charges WHERE amount = 2`); got != 1 {
		t.Errorf("B's charges = %d, want 1", got)
	}

	// The servers share the layer's key space (servers.go): a per-request
	// server must replay what another instance recorded. So a key that A
	// recorded replays A's result on B too.
	res := call(t, csB, "who", "a1", map[string]any{})
	if got := whoOf(t, res); got != "A" || callMeta(res)["replayed"] != true {
		t.Errorf("key a1 on server B = %s replayed=%v, want A's recorded result", got, callMeta(res)["replayed"])
	}
}

func TestServers_AddToolWithoutInstall(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*mcp.Server{
		"PlainServer":         mcp.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil),
		"AnotherLayersServer": other.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil),
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				msg := fmt.Sprint(recover())
				if !strings.Contains(msg, `outbox.AddTool "who": the layer is not installed on this server`) ||
					!strings.Contains(msg, "Layer.Install") {
					t.Errorf("panic = %q, want one naming the tool and Layer.Install", msg)
				}
			}()
			addWho(l, s, "A", 1)
		})
	}
}

// Installing twice installs once: two middlewares of one layer would claim
// the call twice, and the inner claim would wait for the outer one.
func TestServers_InstallTwice(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l, err := outbox.New(db, &outbox.Options{InFlightWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
	l.Install(s)
	addWho(l, s, "A", 1)
	res := call(t, connect(t, s), "who", "k", map[string]any{})
	if got := whoOf(t, res); got != "A" {
		t.Fatalf("call reached %q", got)
	}
}

// waitServers runs the collector until the layer's registry holds want
// servers, or fails after a deadline.
func waitServers(t *testing.T, l *outbox.Layer, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		runtime.GC() // collects dropped servers; their cleanups run after it
		if got := outbox.ServersOf(l); got == want {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the registry holds %d servers, want %d: dropped servers leak", got, want)
		}
		runtime.Gosched()
	}
}

// Servers built and dropped, as go-sdk's getServer may build one per
// request, leave the layer's registry.
func TestServers_RegistryForgetsDroppedServers(t *testing.T) {
	t.Parallel()
	l, err := outbox.New(openDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	kept := l.NewServer(&mcp.Implementation{Name: "kept", Version: "v0"}, nil)
	addWho(l, kept, "kept", 1)

	t.Run("Built", func(t *testing.T) {
		const n = 200
		for i := range n {
			s := l.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil)
			addWho(l, s, fmt.Sprint(i), 1)
		}
		if got := outbox.ServersOf(l); got < 2 {
			t.Fatalf("registry holds %d servers right after building %d", got, n)
		}
		waitServers(t, l, 1)
	})

	// A server per request over real Streamable HTTP, each answering one
	// call: none of them stays in the registry once its request is done.
	t.Run("PerRequest", func(t *testing.T) {
		var built atomic.Int32
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server {
			built.Add(1)
			s := l.NewServer(&mcp.Implementation{Name: "per-request", Version: "v0"}, nil)
			addWho(l, s, "per-request", 3)
			return s
		}, &mcp.StreamableHTTPOptions{Stateless: true})
		srv := httptest.NewServer(h)
		defer srv.Close()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, nil).
			Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.URL}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			if got := whoOf(t, call(t, cs, "who", fmt.Sprint("r", i), map[string]any{})); got != "per-request" {
				t.Fatalf("call reached %q", got)
			}
		}
		cs.Close()
		if got := built.Load(); got < 10 {
			t.Fatalf("getServer built %d servers for 10 calls, want one per request", got)
		}
		waitServers(t, l, 1)
	})

	// The server still in use kept its tool all along.
	if got := whoOf(t, call(t, connect(t, kept), "who", "k", map[string]any{})); got != "kept" {
		t.Errorf("kept server's call reached %q", got)
	}
}

// Servers of different tenants on one layer never meet: the same key, the
// same arguments and the same principal run each tenant's own handler,
// keyless calls too (their fingerprints differ by tenant), and call_status
// sees its own tenant's calls only. Two servers of one tenant share its
// calls, as a server per request must.
func TestServers_Tenants(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	newServer := func(name, tenant string) *mcp.Server {
		return l.NewServer(&mcp.Implementation{Name: name, Version: "v0"}, &outbox.ServerOptions{Tenant: tenant})
	}
	acme, globex, acme2 := newServer("acme", "acme"), newServer("globex", "globex"), newServer("acme-2", "acme")
	runsAcme, runsGlobex := addWho(l, acme, "acme", 1), addWho(l, globex, "globex", 2)
	addWho(l, acme2, "acme-2", 3)
	csAcme, csGlobex, csAcme2 := connect(t, acme), connect(t, globex), connect(t, acme2)

	for _, key := range []string{"same-key", ""} { // "" sends no key: a fingerprint
		if got := whoOf(t, call(t, csAcme, "who", key, map[string]any{})); got != "acme" {
			t.Errorf("key %q on acme reached %q", key, got)
		}
		res := call(t, csGlobex, "who", key, map[string]any{})
		if got := whoOf(t, res); got != "globex" || callMeta(res)["replayed"] != false {
			t.Errorf("key %q on globex = %s replayed=%v; want globex's own handler, not acme's result", key, got, callMeta(res)["replayed"])
		}
		res = call(t, csAcme2, "who", key, map[string]any{})
		if got := whoOf(t, res); got != "acme" || callMeta(res)["replayed"] != true {
			t.Errorf("key %q on acme's second server = %s replayed=%v; want acme's recorded result", key, got, callMeta(res)["replayed"])
		}
	}
	if *runsAcme != 2 || *runsGlobex != 2 {
		t.Errorf("handler runs acme=%d globex=%d, want 2 each (one keyed, one keyless)", *runsAcme, *runsGlobex)
	}
	if got := count(t, db.Read, `SELECT count(*) FROM calls WHERE principal = 'tenant:globex/local'`); got != 2 {
		t.Errorf("globex's calls under its scoped principal = %d, want 2", got)
	}

	status := func(cs *mcp.ClientSession) string {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: outbox.StatusToolName, Arguments: map[string]any{"key": "same-key"}})
		if err != nil {
			t.Fatal(err)
		}
		return text(res)
	}
	if s := status(csGlobex); !strings.Contains(s, `"globex"`) || strings.Contains(s, `"acme"`) {
		t.Errorf("call_status on globex: %s; want globex's call only", s)
	}

	for _, bad := range []string{"a/b", "ten ant", strings.Repeat("x", 65)} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "tenant") {
					t.Errorf("NewServer with tenant %q: panic %v; want one naming the tenant", bad, r)
				}
			}()
			newServer("bad", bad)
		}()
	}
}

// A side-effecting tool registered with mcp.AddTool on the layer's server
// runs again on a retry with the same key: the layer cannot record what it
// does not wrap. What it can do is say so, once per tool, when such a tool
// is first called; call_status, the layer's own plain tool, and unknown
// tools say nothing.
func TestServers_PlainToolCallIsLogged(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	b := setup(t, &outbox.Options{Logger: logs.logger()}, nil)
	var runs atomic.Int64
	mcp.AddTool(b.server, &mcp.Tool{Name: "plain_book", Description: "Books, unrecorded."},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			runs.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "booked"}}}, nil, nil
		})
	for range 2 {
		call(t, b.session, "plain_book", "same-key", map[string]any{})
	}
	if runs.Load() != 2 {
		t.Fatalf("plain tool ran %d times, want 2 (the layer does not record it)", runs.Load())
	}
	callCharge(t, b.session, "charge-1", 100)
	call(t, b.session, outbox.StatusToolName, "", map[string]any{"key": "charge-1"})
	if _, err := callErr(context.Background(), b.session, "no_such_tool", "", map[string]any{}); err == nil {
		t.Fatal("an unknown tool answered")
	}
	const msg = "a tool registered with mcp.AddTool, not outbox.AddTool, was called: its calls are not recorded, " +
		"and a retry with the same key runs it again; register it with outbox.AddTool (annotated readOnlyHint if it changes nothing)"
	recs := logs.records(t, msg)
	if len(recs) != 1 || recs[0]["tool"] != "plain_book" || recs[0]["level"] != "WARN" {
		t.Errorf("warnings for plain tools: %v, want one for plain_book\nlog:\n%s", recs, logs.String())
	}
}
