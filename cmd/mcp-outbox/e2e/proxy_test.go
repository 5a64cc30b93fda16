package e2e

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// proxyFixture is `mcp-outbox proxy` in front of an upstream (TypeScript or
// Python), both real processes sharing one SQLite file, with a downstream
// fake as destination "payments".
type proxyFixture struct {
	up     upstreamKind
	dbPath string
	db     *sql.DB
	fake   *downstream.Server
	stderr *lineWatch // the proxy's stderr, upstream lines included
}

// newProxyFixture prepares the database (the outbox tables exist before the
// upstream starts, as the contract requires) and the downstream.
func newProxyFixture(t *testing.T, up upstreamKind) *proxyFixture {
	t.Helper()
	dbPath := filepath.Join(t.TempDir(), "shared.db")
	ctx := context.Background()
	sdb, err := schema.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	sdb.Close()
	return &proxyFixture{up: up, dbPath: dbPath, db: openLedgerDB(t, dbPath), fake: downstream.Start(t, nil)}
}

// proxyCommand is `binary proxy --db ... --dest payments=... args -- node
// server.mjs` (or `python server.py`), with upstreamEnv for the upstream (the
// proxy passes its environment on).
func (f *proxyFixture) proxyCommand(t *testing.T, binary string, upstreamEnv []string, args ...string) *exec.Cmd {
	t.Helper()
	up := f.up.command(t, f.dbPath, upstreamEnv...)
	all := append([]string{"proxy", "--db", f.dbPath, "--dest", paymentsDest(f.fake), "--log-level", "info"}, args...)
	all = append(all, "--", up.Path)
	all = append(all, up.Args[1:]...)
	cmd := exec.Command(binary, all...)
	cmd.Env, cmd.Dir = up.Env, up.Dir
	f.stderr = newLineWatch(t, "[upstream] "+f.up.ready)
	cmd.Stderr = f.stderr
	return cmd
}

// connectProxy starts the proxy over stdio and connects a go-sdk client,
// which records the progress notifications it gets.
func (f *proxyFixture) connectProxy(t *testing.T, cmd *exec.Cmd, progress chan<- *mcp.ProgressNotificationParams) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{}
	if progress != nil {
		opts.ProgressNotificationHandler = func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			progress <- r.Params
		}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "proxy-test", Version: "v0"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to the proxy: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func tsCharge(key, customer string, cents int) *mcp.CallToolParams {
	p := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"customer": customer, "amount_cents": cents}}
	if key != "" {
		p.Meta = mcp.Meta{outbox.MetaKeyIdempotency: key}
	}
	return p
}

func callTool(t *testing.T, cs *mcp.ClientSession, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return cs.CallTool(ctx, p)
}

func errorCodeOf(res *mcp.CallToolResult) string {
	code, _ := res.Meta[outbox.MetaKeyError].(string)
	return code
}

// TestProxyCooperating: through the proxy, a cooperating upstream's charge
// happens once per key, its effect is delivered once, retries replay, and
// everything else of MCP passes through.
func TestProxyCooperating(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyCooperating)
}

func testProxyCooperating(t *testing.T, up upstreamKind) {
	f := newProxyFixture(t, up)
	progress := make(chan *mcp.ProgressNotificationParams, 8)
	cs := f.connectProxy(t, f.proxyCommand(t, bin, nil, "--cooperating"), progress)

	select {
	case <-f.stderr.found:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream's stderr did not come through the proxy with its prefix")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	for _, want := range []string{"charge", "get_balance", "set_nickname", outbox.StatusToolName} {
		if !containsString(names, want) {
			t.Errorf("tools/list through the proxy = %v, missing %s", names, want)
		}
	}
	if init := cs.InitializeResult(); init.Capabilities.Experimental[outbox.CapabilityName] == nil {
		t.Errorf("initialize result does not advertise %q: %+v", outbox.CapabilityName, init.Capabilities)
	}
	// Resources and prompts are the upstream's, unchanged.
	res, err := cs.ListResources(ctx, nil)
	if err != nil || len(res.Resources) == 0 || res.Resources[0].URI != "ledger://charges" {
		t.Errorf("resources/list through the proxy = %+v, %v; want ledger://charges", res, err)
	}
	prompts, err := cs.ListPrompts(ctx, nil)
	if err != nil || len(prompts.Prompts) == 0 || prompts.Prompts[0].Name != "summarize_charges" {
		t.Errorf("prompts/list through the proxy = %+v, %v; want summarize_charges", prompts, err)
	}

	first := mustSucceed(t, cs, tsCharge("order-1", "ada", 500))
	wantReplay(t, first, false, "meta")
	again := mustSucceed(t, cs, tsCharge("order-1", "ada", 500))
	wantReplay(t, again, true, "meta")
	if resultText(again) == resultText(first) || !strings.Contains(resultText(again), resultText(first)) {
		t.Errorf("replay %q does not carry the original %q", resultText(again), resultText(first))
	}
	conflict, err := callTool(t, cs, tsCharge("order-1", "ada", 999))
	if err != nil || !conflict.IsError || errorCodeOf(conflict) != "key_conflict" {
		t.Errorf("same key, other arguments: %v %v, want a key_conflict tool error", conflict, err)
	}
	// Without a key, the fingerprint makes the immediate retry a replay.
	mustSucceed(t, cs, tsCharge("", "bob", 700))
	wantReplay(t, mustSucceed(t, cs, tsCharge("", "bob", 700)), true, "fingerprint")

	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 2 {
		t.Errorf("charges = %d, want 2 (one per logical call)", got)
	}
	effects := waitEffects(t, f.db, 2, 30*time.Second, "delivered")
	for _, e := range effects {
		if n := len(requestsFor(f.fake, e.key)); n != 1 {
			t.Errorf("effect %s reached the downstream %d times, want once", e.key, n)
		}
	}

	// The status tool is the proxy's.
	st := callStatus(t, cs, "order-1")
	if st["state"] != "completed" {
		t.Errorf("call_status order-1 = %v, want completed", st)
	}

	// Unrecorded tools pass through: idempotent and read-only.
	mustSucceed(t, cs, &mcp.CallToolParams{Name: "set_nickname", Arguments: map[string]any{"customer": "ada", "nickname": "A"}})
	bal := mustSucceed(t, cs, &mcp.CallToolParams{Name: "get_balance", Arguments: map[string]any{"customer": "ada"}})
	if !strings.Contains(resultText(bal), "500") {
		t.Errorf("get_balance = %q, want ada's 500", resultText(bal))
	}

	// Progress notifications of the upstream reach the client.
	p := &mcp.CallToolParams{Name: "slow_charge", Arguments: map[string]any{"customer": "cy", "amount_cents": 100, "delay_ms": 10}}
	p.SetProgressToken("tok-1")
	mustSucceed(t, cs, p)
	select {
	case n := <-progress:
		if n.ProgressToken != "tok-1" {
			t.Errorf("progress token %v, want tok-1", n.ProgressToken)
		}
	case <-time.After(10 * time.Second):
		t.Error("no progress notification came through the proxy")
	}
}

// TestProxyUpstreamCrashAfterCommit: the upstream commits, then dies
// before answering. The proxy answers with the committed outcome, restarts
// the upstream, and the client's session goes on.
func TestProxyUpstreamCrashAfterCommit(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyUpstreamCrashAfterCommit)
}

func testProxyUpstreamCrashAfterCommit(t *testing.T, up upstreamKind) {
	f := newProxyFixture(t, up)
	marker := filepath.Join(t.TempDir(), "crash-once")
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cs := f.connectProxy(t, f.proxyCommand(t, bin, []string{"UPSTREAM_CRASH_ONCE_FILE=" + marker}, "--cooperating"), nil)

	res := mustSucceed(t, cs, tsCharge("crash-1", "ada", 300))
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the upstream did not crash (marker still there: %v)", err)
	}
	if m := callMetaOf(res); m == nil || m["state"] != "completed" || m["replayed"] != false {
		t.Errorf("answer after the upstream's crash: meta %v, want the completed outcome, not a replay", res.Meta)
	}
	// The same session works on the restarted upstream.
	mustSucceed(t, cs, tsCharge("crash-2", "bob", 400))
	wantReplay(t, mustSucceed(t, cs, tsCharge("crash-1", "ada", 300)), true, "meta")
	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 2 {
		t.Errorf("charges = %d, want 2", got)
	}
	waitEffects(t, f.db, 2, 30*time.Second, "delivered")
}

// TestProxyUpstreamCrashBeforeCommit: the upstream dies before its commit:
// nothing happened, the client is told a retry runs the call, and it does,
// once.
func TestProxyUpstreamCrashBeforeCommit(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyUpstreamCrashBeforeCommit)
}

func testProxyUpstreamCrashBeforeCommit(t *testing.T, up upstreamKind) {
	f := newProxyFixture(t, up)
	marker := filepath.Join(t.TempDir(), "crash-once")
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cs := f.connectProxy(t, f.proxyCommand(t, bin, []string{"UPSTREAM_CRASH_BEFORE_COMMIT_ONCE_FILE=" + marker}, "--cooperating"), nil)

	res, err := callTool(t, cs, tsCharge("early-1", "ada", 300))
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || errorCodeOf(res) != "not_recorded" {
		t.Fatalf("answer after a crash before the commit: %s (meta %v), want a not_recorded error", resultText(res), res.Meta)
	}
	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 0 {
		t.Fatalf("charges = %d after a crash before the commit, want 0", got)
	}
	wantReplay(t, mustSucceed(t, cs, tsCharge("early-1", "ada", 300)), false, "meta")
	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
}

// TestProxyCrashAfterForward kills the proxy (SIGKILL) right after it
// forwarded a call. A new proxy on the same file, retried with the same
// key, ends with exactly one charge and one delivery, whether the old
// upstream committed before it went away or not.
func TestProxyCrashAfterForward(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyCrashAfterForward)
}

func testProxyCrashAfterForward(t *testing.T, up upstreamKind) {
	f := newProxyFixture(t, up)
	cmd := f.proxyCommand(t, failpointBin, nil, "--cooperating")
	cmd.Env = append(cmd.Env, "MCP_OUTBOX_FAILPOINTS=proxy.after_forward=crash")
	cs := f.connectProxy(t, cmd, nil)
	if _, err := callTool(t, cs, tsCharge("fwd-1", "ada", 300)); err == nil {
		t.Fatal("the call was answered; want the proxy killed after forwarding")
	}
	cs.Close()
	wantKilled(t, cmd)

	cs2 := f.connectProxy(t, f.proxyCommand(t, bin, nil, "--cooperating"), nil)
	res := mustSucceed(t, cs2, tsCharge("fwd-1", "ada", 300))
	t.Logf("retry after the proxy's crash: replayed=%v", callMetaOf(res)["replayed"])
	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 1 {
		t.Errorf("charges = %d, want exactly 1", got)
	}
	effects := waitEffects(t, f.db, 1, 30*time.Second, "delivered")
	if n := len(requestsFor(f.fake, effects[0].key)); n != 1 {
		t.Errorf("the effect reached the downstream %d times, want once", n)
	}
}

// TestProxyNonCooperatingUnknown: an upstream that does not record its
// outcome dies after doing the work. The call becomes unknown; a retry is
// not run again but told the outcome is unknown, the status tool says so,
// and an operator settles it.
func TestProxyNonCooperatingUnknown(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyNonCooperatingUnknown)
}

func testProxyNonCooperatingUnknown(t *testing.T, up upstreamKind) {
	f := newProxyFixture(t, up)
	marker := filepath.Join(t.TempDir(), "crash-once")
	cs := f.connectProxy(t, f.proxyCommand(t, bin, []string{"UPSTREAM_COOPERATE=0", "UPSTREAM_CRASH_ONCE_FILE=" + marker}), nil)

	// First the normal path: the proxy records the answer and replays it.
	mustSucceed(t, cs, tsCharge("nc-1", "ada", 100))
	wantReplay(t, mustSucceed(t, cs, tsCharge("nc-1", "ada", 100)), true, "meta")

	// Then the upstream charges and dies before answering.
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	res, err := callTool(t, cs, tsCharge("nc-2", "bob", 200))
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || errorCodeOf(res) != "outcome_unknown" {
		t.Fatalf("answer lost by a non-cooperating upstream: %s (meta %v), want an outcome_unknown error", resultText(res), res.Meta)
	}
	retry, err := callTool(t, cs, tsCharge("nc-2", "bob", 200))
	if err != nil {
		t.Fatal(err)
	}
	if !retry.IsError || errorCodeOf(retry) != "outcome_unknown" || !strings.Contains(resultText(retry), outbox.StatusToolName) {
		t.Errorf("retry of an unknown call: %s (meta %v), want an outcome_unknown error naming %s", resultText(retry), retry.Meta, outbox.StatusToolName)
	}
	if got := countRows(t, f.db, `SELECT count(*) FROM charges WHERE customer = 'bob'`); got != 1 {
		t.Errorf("bob's charges = %d, want 1: the unknown call must not run again", got)
	}
	if st := callStatus(t, cs, "nc-2"); st["state"] != "unknown" {
		t.Errorf("call_status nc-2 = %v, want unknown", st)
	}

	// The operator looked: the charge happened.
	out := runCLI(t, nil, "outbox", "resolve-call", "--db", f.dbPath, "--key", "nc-2", "--outcome", "completed", "--note", "charge 2 exists")
	if out.code != 0 {
		t.Fatalf("resolve-call: exit %d: %s%s", out.code, out.stdout, out.stderr)
	}
	settled := mustSucceed(t, cs, tsCharge("nc-2", "bob", 200))
	if !strings.Contains(resultText(settled), "charge 2 exists") {
		t.Errorf("retry after the operator settled it: %q, want the operator's note replayed", resultText(settled))
	}
	if got := countRows(t, f.db, `SELECT count(*) FROM charges WHERE customer = 'bob'`); got != 1 {
		t.Errorf("bob's charges = %d after settling, want 1", got)
	}
}

// TestProxyCooperatingUpstreamWithoutFlag: a cooperating upstream behind
// a proxy run without --cooperating (the flag forgotten) records its
// outcomes itself, so the proxy's own record finds the row ended. The
// call is answered with the upstream's outcome, a retry replays it at
// once, its effect is delivered, and the log says to add the flag. Before,
// a stranger's call answered outcome_unknown, its retry hung until the
// client gave up (the failed record had left SQLite's writer held), and
// the effect waited for the next proxy.
func TestProxyCooperatingUpstreamWithoutFlag(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyCooperatingUpstreamWithoutFlag)
}

func testProxyCooperatingUpstreamWithoutFlag(t *testing.T, up upstreamKind) {
	f := newProxyFixture(t, up)
	cs := f.connectProxy(t, f.proxyCommand(t, bin, nil), nil)
	first := mustSucceed(t, cs, tsCharge("plain-1", "ada", 100))
	wantReplay(t, first, false, "meta")
	again := mustSucceed(t, cs, tsCharge("plain-1", "ada", 100))
	wantReplay(t, again, true, "meta")
	mustSucceed(t, cs, tsCharge("plain-2", "bob", 200))
	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 2 {
		t.Errorf("charges = %d, want 2 (one per key)", got)
	}
	for _, e := range waitEffects(t, f.db, 2, 30*time.Second, "delivered") {
		if n := len(requestsFor(f.fake, e.key)); n != 1 {
			t.Errorf("effect %s reached the downstream %d times, want once", e.key, n)
		}
	}
	if st := callStatus(t, cs, "plain-1"); st["state"] != "completed" {
		t.Errorf("call_status plain-1 = %v, want completed", st)
	}
	if n := strings.Count(f.stderr.String(), "but the proxy runs without --cooperating"); n != 1 {
		t.Errorf("the proxy's log names the missing --cooperating %d times, want once", n)
	}
}

// TestProxyCooperatingFlagPlainUpstream: behind --cooperating, a tool that
// answers without recording its outcome is recorded by the proxy (once per
// key, replayed), and the log says, once, that a crash would have a retry
// run it again.
func TestProxyCooperatingFlagPlainUpstream(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyCooperatingFlagPlainUpstream)
}

func testProxyCooperatingFlagPlainUpstream(t *testing.T, up upstreamKind) {
	f := newProxyFixture(t, up)
	cs := f.connectProxy(t, f.proxyCommand(t, bin, []string{"UPSTREAM_COOPERATE=0"}, "--cooperating"), nil)
	wantReplay(t, mustSucceed(t, cs, tsCharge("coop-plain-1", "ada", 100)), false, "meta")
	wantReplay(t, mustSucceed(t, cs, tsCharge("coop-plain-1", "ada", 100)), true, "meta")
	mustSucceed(t, cs, tsCharge("coop-plain-2", "bob", 200))
	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 2 {
		t.Errorf("charges = %d, want 2 (one per key)", got)
	}
	if n := strings.Count(f.stderr.String(), "answered without recording its outcome"); n != 1 {
		t.Errorf("the proxy's log warns of the tool that does not record %d times, want once", n)
	}
}

// TestProxyHTTP: the proxy serves Streamable HTTP in front of a stdio
// upstream, and proxies to an upstream served over Streamable HTTP.
func TestProxyHTTP(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, upstreamKinds, testProxyHTTP)
}

func testProxyHTTP(t *testing.T, up upstreamKind) {
	t.Run("serve", func(t *testing.T) {
		f := newProxyFixture(t, up)
		cmd := f.proxyCommand(t, bin, nil, "--cooperating", "--http", "127.0.0.1:0")
		url := startHTTPCommand(t, cmd)
		// The TypeScript and Python upstreams speak up to 2025-11-25; the
		// proxy passes their negotiation through.
		cs := connectHTTP(t, url, "2025-11-25", nil)
		mustSucceed(t, cs, tsCharge("h-1", "ada", 100))
		wantReplay(t, mustSucceed(t, cs, tsCharge("h-1", "ada", 100)), true, "meta")
		if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
		if st := callStatus(t, cs, "h-1"); st["state"] != "completed" {
			t.Errorf("call_status over HTTP = %v, want completed", st)
		}
	})
	t.Run("upstream", func(t *testing.T) {
		f := newProxyFixture(t, up)
		upCmd := up.command(t, f.dbPath, "UPSTREAM_HTTP_PORT=0")
		ready := newLineWatch(t, up.ready)
		upCmd.Stderr = ready
		if err := upCmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { upCmd.Process.Kill(); upCmd.Wait() })
		var url string
		select {
		case line := <-ready.found:
			_, url, _ = strings.Cut(line, "url=")
		case <-time.After(30 * time.Second):
			t.Fatal("the HTTP upstream did not start")
		}
		cmd := exec.Command(bin, "proxy", "--db", f.dbPath, "--dest", paymentsDest(f.fake), "--cooperating", "--upstream", strings.TrimSpace(url))
		cmd.Stderr = testWriter{t}
		cs := f.connectProxy(t, cmd, nil)
		mustSucceed(t, cs, tsCharge("u-1", "ada", 100))
		wantReplay(t, mustSucceed(t, cs, tsCharge("u-1", "ada", 100)), true, "meta")
		if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 1 {
			t.Errorf("charges = %d, want 1", got)
		}
		waitEffects(t, f.db, 1, 30*time.Second, "delivered")
	})
}

// TestProxyUsage: a proxy without a usable upstream refuses to start, says
// why, and creates no database file.
func TestProxyUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "never.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy", "--db", db}, "no upstream"},
		{[]string{"proxy", "--db", db, "--upstream", "http://127.0.0.1:1/mcp", "--", "node", "x.mjs"}, "not both"},
		{[]string{"proxy", "--db", db, "--upstream", "ftp://example/mcp"}, "want an http:// or https:// URL"},
		{[]string{"proxy", "--db", db, "--http", "nope", "--", "node", "x.mjs"}, "want HOST:PORT"},
	} {
		out := runCLI(t, nil, tc.args...)
		if out.code != 2 || !strings.Contains(out.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 saying %q", tc.args, out.code, out.stderr, tc.want)
		}
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("a refused proxy created %s (%v)", db, err)
	}
	help := runCLI(t, nil, "proxy", "--help")
	if help.code != 0 || !strings.Contains(help.stdout, "--cooperating") || !strings.Contains(help.stdout, "schema/README.md") {
		t.Errorf("proxy --help: exit %d, %q", help.code, help.stdout)
	}
}
