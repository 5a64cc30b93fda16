package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The upstream contract tests drive each upstream (testdata/ts-upstream/server.mjs
// on contract.mjs, testdata/py-upstream/server.py on mcp_outbox_upstream.py)
// directly, without the proxy: the test plays the proxy's part by inserting
// the claim (a calls row in state in_flight) and passing it in _meta, then
// checks what the upstream committed. schema/README.md is the contract under
// test; these tests are what says each language's contract module is right
// against the Go side.

// contractUpstreamKinds are the upstreams the contract tests run: each
// language, and the Python one in every virtual environment (FastMCP's API
// is what differs between SDK versions: mcp 1.29.1, 1.30.0 and 2.3.0).
func contractUpstreamKinds() []upstreamKind {
	kinds := append([]upstreamKind{}, upstreamKinds...)
	for _, venv := range []string{"latest", "newest"} {
		if pyVenvDefault() != venv {
			kinds = append(kinds, pyUpstreamKindVenv(venv))
		}
	}
	return kinds
}

// contractUpstream is a running upstream and the database it shares.
type contractUpstream struct {
	db    *schema.DB
	cs    *mcp.ClientSession
	ready string // the upstream's ready line
}

func startContractUpstream(t *testing.T, up upstreamKind, env ...string) *contractUpstream {
	t.Helper()
	dbPath := filepath.Join(t.TempDir(), "shared.db")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := schema.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })

	cmd := up.command(t, dbPath, env...)
	watch := newLineWatch(t, up.ready)
	cmd.Stderr = watch
	client := mcp.NewClient(&mcp.Implementation{Name: "contract-test", Version: "v0"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to the %s upstream: %v", up.name, err)
	}
	t.Cleanup(func() { cs.Close() })
	u := &contractUpstream{db: db, cs: cs}
	select {
	case u.ready = <-watch.found:
	case <-ctx.Done():
		t.Fatalf("the %s upstream printed no %q line", up.name, up.ready)
	}
	return u
}

// contractClaim is a calls row in state in_flight, as the proxy writes it.
type contractClaim struct {
	key, uid, owner string
	rowID           int64
	expiresAt       int64
}

func (c contractClaim) meta() mcp.Meta { return tsClaimMeta(c.key, c.uid, c.rowID, c.owner) }

func contractHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// insertClaim writes an in_flight calls row for tool and args with a new
// owner, mirroring the columns of schema/migrations/001_outbox.up.sql.
func (u *contractUpstream) insertClaim(t *testing.T, tool string, args any) contractClaim {
	t.Helper()
	argsJSON, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(argsJSON)
	now := time.Now().UnixMilli()
	c := contractClaim{
		key:       "contract-" + contractHex(t, 8),
		uid:       "call_" + contractHex(t, 12),
		owner:     "contract-test/" + contractHex(t, 4) + "#1",
		expiresAt: now + 24*time.Hour.Milliseconds(),
	}
	res, err := u.db.Write.Exec(`
		INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, owner, lease_until, created_at, expires_at)
		VALUES (?, 'local', ?, 'meta', ?, ?, 'in_flight', ?, ?, ?, ?)`,
		c.uid, c.key, tool, hex.EncodeToString(sum[:]), c.owner, now+time.Minute.Milliseconds(), now, c.expiresAt)
	if err != nil {
		t.Fatalf("insert claim: %v", err)
	}
	if c.rowID, err = res.LastInsertId(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (u *contractUpstream) call(t *testing.T, tool string, args map[string]any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := u.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return res
}

// contractCallRow is what the test reads back of a calls row.
type contractCallRow struct {
	state, owner string
	leaseUntil   int64
	result       sql.NullString
	completedAt  sql.NullInt64
	expiresAt    int64
}

func (u *contractUpstream) readCall(t *testing.T, rowID int64) contractCallRow {
	t.Helper()
	var r contractCallRow
	err := u.db.Read.QueryRow(`SELECT state, owner, lease_until, result, completed_at, expires_at FROM calls WHERE id = ?`, rowID).
		Scan(&r.state, &r.owner, &r.leaseUntil, &r.result, &r.completedAt, &r.expiresAt)
	if err != nil {
		t.Fatalf("read calls row %d: %v", rowID, err)
	}
	return r
}

type contractCharge struct {
	id          int64
	amountCents int64
	callID      string
}

func (u *contractUpstream) charges(t *testing.T, customer string) []contractCharge {
	t.Helper()
	rows, err := u.db.Read.Query(`SELECT id, amount_cents, call_id FROM charges WHERE customer = ? ORDER BY id`, customer)
	if err != nil {
		t.Fatalf("read charges: %v", err)
	}
	defer rows.Close()
	var out []contractCharge
	for rows.Next() {
		var c contractCharge
		if err := rows.Scan(&c.id, &c.amountCents, &c.callID); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

type contractEffect struct {
	callID                     sql.NullInt64
	seq                        int64
	destination, method, path  string
	headers                    string
	body                       []byte
	idempotencyKey, state      string
	nextAttemptAt, attempts    int64
	createdAt, updatedAt       int64
	leaseOwner, lastError      string
	deliveredAt, sendStartedAt sql.NullInt64
}

// effects returns the effects whose idempotency_key starts with prefix.
func (u *contractUpstream) effects(t *testing.T, prefix string) []contractEffect {
	t.Helper()
	rows, err := u.db.Read.Query(`
		SELECT call_id, seq, destination, method, path, headers, body, idempotency_key, state,
		       next_attempt_at, attempts, created_at, updated_at, lease_owner, last_error, delivered_at, send_started_at
		FROM effects WHERE substr(idempotency_key, 1, length(?)) = ? ORDER BY id`, prefix, prefix)
	if err != nil {
		t.Fatalf("read effects: %v", err)
	}
	defer rows.Close()
	var out []contractEffect
	for rows.Next() {
		var e contractEffect
		if err := rows.Scan(&e.callID, &e.seq, &e.destination, &e.method, &e.path, &e.headers, &e.body,
			&e.idempotencyKey, &e.state, &e.nextAttemptAt, &e.attempts, &e.createdAt, &e.updatedAt,
			&e.leaseOwner, &e.lastError, &e.deliveredAt, &e.sendStartedAt); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (u *contractUpstream) countEffects(t *testing.T) int {
	t.Helper()
	var n int
	if err := u.db.Read.QueryRow(`SELECT count(*) FROM effects`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// neutralResult is the protocol-neutral JSON of a result, as recorded in
// calls.result: content, structured content, isError.
func neutralResult(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var sc any
	if res.StructuredContent != nil {
		// Through JSON, so that a decoded map and a typed value compare equal.
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &sc); err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(&mcp.CallToolResult{Content: res.Content, StructuredContent: sc, IsError: res.IsError})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkContractRecorded asserts that the call's row holds state and, as its result,
// the result the upstream answered.
func checkContractRecorded(t *testing.T, u *contractUpstream, c contractClaim, state string, res *mcp.CallToolResult) {
	t.Helper()
	r := u.readCall(t, c.rowID)
	if r.state != state || r.owner != "" || r.leaseUntil != 0 || !r.completedAt.Valid {
		t.Errorf("calls row %d: state %q owner %q lease_until %d completed_at %v; want %s, owner '', lease_until 0, completed_at set",
			c.rowID, r.state, r.owner, r.leaseUntil, r.completedAt, state)
	}
	if r.expiresAt != c.expiresAt {
		t.Errorf("calls row %d: expires_at changed from %d to %d; the upstream must not touch it", c.rowID, c.expiresAt, r.expiresAt)
	}
	if !r.result.Valid {
		t.Fatalf("calls row %d has no result", c.rowID)
	}
	var recorded mcp.CallToolResult
	if err := json.Unmarshal([]byte(r.result.String), &recorded); err != nil {
		t.Fatalf("calls.result %s does not decode into a CallToolResult: %v", r.result.String, err)
	}
	if got, want := neutralResult(t, &recorded), neutralResult(t, res); got != want {
		t.Errorf("calls.result differs from the answer:\nrecorded %s\nanswered %s", got, want)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.result.String), &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["_meta"]; ok {
		t.Errorf("calls.result carries _meta: %s", r.result.String)
	}
}

func checkContractInFlight(t *testing.T, u *contractUpstream, c contractClaim) {
	t.Helper()
	r := u.readCall(t, c.rowID)
	if r.state != "in_flight" || r.owner != c.owner || r.result.Valid || r.completedAt.Valid {
		t.Errorf("calls row %d: state %q owner %q result %v completed_at %v; want untouched (in_flight, owner %q, no result)",
			c.rowID, r.state, r.owner, r.result, r.completedAt, c.owner)
	}
}

var unclaimedEffectKey = regexp.MustCompile(`^(call_[0-9a-f]{24})-1$`)

func TestUpstreamContract(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, contractUpstreamKinds(), testUpstreamContract)
}

func testUpstreamContract(t *testing.T, up upstreamKind) {
	u := startContractUpstream(t, up)
	if !strings.Contains(u.ready, " cooperate=1") {
		t.Errorf("ready line %q, want cooperate=1", u.ready)
	}

	t.Run("tools", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lt, err := u.cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		tools := map[string]*mcp.Tool{}
		for _, tool := range lt.Tools {
			tools[tool.Name] = tool
			if tool.Description == "" {
				t.Errorf("tool %s has no description", tool.Name)
			}
		}
		for _, name := range []string{"charge", "slow_charge", "get_balance", "set_nickname"} {
			if tools[name] == nil {
				t.Fatalf("tools/list has no %s: %v", name, lt.Tools)
			}
		}
		if a := tools["charge"].Annotations; a != nil {
			t.Errorf("charge has annotations %+v, want none (destructive by default)", a)
		}
		if a := tools["get_balance"].Annotations; a == nil || !a.ReadOnlyHint {
			t.Errorf("get_balance annotations %+v, want readOnlyHint", a)
		}
		if a := tools["set_nickname"].Annotations; a == nil || !a.IdempotentHint || a.DestructiveHint == nil || *a.DestructiveHint {
			t.Errorf("set_nickname annotations %+v, want idempotentHint, destructiveHint false", a)
		}
		lr, err := u.cs.ListResources(ctx, nil)
		if err != nil || len(lr.Resources) != 1 || lr.Resources[0].URI != "ledger://charges" {
			t.Errorf("resources/list: %v %v, want ledger://charges", lr, err)
		}
		lp, err := u.cs.ListPrompts(ctx, nil)
		if err != nil || len(lp.Prompts) != 1 || lp.Prompts[0].Name != "summarize_charges" {
			t.Errorf("prompts/list: %v %v, want summarize_charges", lp, err)
		}
	})

	t.Run("claimed charge", func(t *testing.T) {
		args := map[string]any{"customer": "alice", "amount_cents": 1234}
		c := u.insertClaim(t, "charge", args)
		res := u.call(t, "charge", args, c.meta())
		if res.IsError {
			t.Fatalf("charge: tool error %q", resultText(res))
		}
		sc, _ := res.StructuredContent.(map[string]any)
		chargeID, _ := sc["chargeId"].(float64)
		if chargeID == 0 || sc["customer"] != "alice" || sc["amount_cents"] != float64(1234) {
			t.Errorf("structuredContent %v, want chargeId, customer alice, amount_cents 1234", res.StructuredContent)
		}
		if want := "charged alice 1234 (charge "; !strings.HasPrefix(resultText(res), want) {
			t.Errorf("text %q, want prefix %q", resultText(res), want)
		}
		checkContractRecorded(t, u, c, "completed", res)

		ch := u.charges(t, "alice")
		if len(ch) != 1 || ch[0].id != int64(chargeID) || ch[0].amountCents != 1234 || ch[0].callID != c.uid {
			t.Errorf("charges of alice: %+v, want one row: id %v, 1234 cents, call_id %s", ch, chargeID, c.uid)
		}

		effs := u.effects(t, c.uid)
		if len(effs) != 1 {
			t.Fatalf("effects of %s: %d, want 1", c.uid, len(effs))
		}
		e := effs[0]
		if e.idempotencyKey != c.uid+"-1" || !e.callID.Valid || e.callID.Int64 != c.rowID || e.seq != 1 {
			t.Errorf("effect: idempotency_key %q call_id %v seq %d; want %s-1, %d, 1", e.idempotencyKey, e.callID, e.seq, c.uid, c.rowID)
		}
		if e.destination != "payments" || e.method != "POST" || e.path != "/v1/charges" {
			t.Errorf("effect: %s %s %s, want payments POST /v1/charges", e.destination, e.method, e.path)
		}
		var headers map[string]string
		if err := json.Unmarshal([]byte(e.headers), &headers); err != nil || len(headers) != 1 || headers["Content-Type"] != "application/json" {
			t.Errorf("effect headers %s (%v), want {\"Content-Type\": \"application/json\"}", e.headers, err)
		}
		var body map[string]any
		if err := json.Unmarshal(e.body, &body); err != nil ||
			body["customer"] != "alice" || body["amount_cents"] != float64(1234) || body["charge_id"] != chargeID {
			t.Errorf("effect body %s (%v), want customer, amount_cents, charge_id %v", e.body, err, chargeID)
		}
		// The dispatcher's columns keep their defaults.
		if e.state != "pending" || e.attempts != 0 || e.leaseOwner != "" || e.lastError != "" || e.deliveredAt.Valid || e.sendStartedAt.Valid {
			t.Errorf("effect dispatcher columns: state %q attempts %d lease_owner %q last_error %q delivered_at %v send_started_at %v; want defaults",
				e.state, e.attempts, e.leaseOwner, e.lastError, e.deliveredAt, e.sendStartedAt)
		}
		if e.nextAttemptAt <= 0 || e.createdAt != e.nextAttemptAt || e.updatedAt != e.nextAttemptAt {
			t.Errorf("effect times: next_attempt_at %d created_at %d updated_at %d, want one unix ms time", e.nextAttemptAt, e.createdAt, e.updatedAt)
		}

		// The same claim delivered again (the call is no longer in flight):
		// the fence refuses it and nothing more is written.
		again := u.call(t, "charge", args, c.meta())
		if !again.IsError || !strings.Contains(resultText(again), "claim lost") {
			t.Errorf("second delivery of a settled claim: %q (isError %v), want a claim-lost tool error", resultText(again), again.IsError)
		}
		checkContractRecorded(t, u, c, "completed", res)
		if n := len(u.charges(t, "alice")); n != 1 {
			t.Errorf("charges of alice after the second delivery: %d, want 1", n)
		}
		if n := len(u.effects(t, c.uid)); n != 1 {
			t.Errorf("effects of %s after the second delivery: %d, want 1", c.uid, n)
		}
	})

	t.Run("wrong owner", func(t *testing.T) {
		args := map[string]any{"customer": "bob", "amount_cents": 500}
		c := u.insertClaim(t, "charge", args)
		stale := c
		stale.owner = "an-attempt-that-was-taken-over#7"
		before := u.countEffects(t)
		res := u.call(t, "charge", args, stale.meta())
		if !res.IsError || !strings.Contains(resultText(res), "claim lost") {
			t.Errorf("charge with a stale owner: %q (isError %v), want a claim-lost tool error", resultText(res), res.IsError)
		}
		checkContractInFlight(t, u, c)
		if ch := u.charges(t, "bob"); len(ch) != 0 {
			t.Errorf("charges of bob: %+v, want none", ch)
		}
		if n := u.countEffects(t); n != before {
			t.Errorf("effects: %d, want %d (none added)", n, before)
		}
	})

	t.Run("amount out of range", func(t *testing.T) {
		for _, amount := range []int{0, -5, 1_000_001} {
			args := map[string]any{"customer": "carol", "amount_cents": amount}
			c := u.insertClaim(t, "charge", args)
			before := u.countEffects(t)
			res := u.call(t, "charge", args, c.meta())
			if !res.IsError || resultText(res) != "amount out of range" {
				t.Errorf("charge of %d: %q (isError %v), want tool error \"amount out of range\"", amount, resultText(res), res.IsError)
			}
			if res.StructuredContent != nil {
				t.Errorf("charge of %d: structuredContent %v on a tool error", amount, res.StructuredContent)
			}
			checkContractRecorded(t, u, c, "failed", res)
			if n := u.countEffects(t); n != before {
				t.Errorf("effects after charge of %d: %d, want %d", amount, n, before)
			}
		}
		if ch := u.charges(t, "carol"); len(ch) != 0 {
			t.Errorf("charges of carol: %+v, want none", ch)
		}
	})

	t.Run("unclaimed charge", func(t *testing.T) {
		res := u.call(t, "charge", map[string]any{"customer": "dave", "amount_cents": 700}, nil)
		if res.IsError {
			t.Fatalf("charge without a claim: tool error %q", resultText(res))
		}
		ch := u.charges(t, "dave")
		if len(ch) != 1 || ch[0].amountCents != 700 {
			t.Fatalf("charges of dave: %+v, want one of 700", ch)
		}
		effs := u.effects(t, ch[0].callID)
		if len(effs) != 1 {
			t.Fatalf("effects of the unclaimed call %s: %d, want 1", ch[0].callID, len(effs))
		}
		m := unclaimedEffectKey.FindStringSubmatch(effs[0].idempotencyKey)
		if m == nil || m[1] != ch[0].callID || effs[0].callID.Valid || effs[0].destination != "payments" {
			t.Errorf("effect of the unclaimed call: idempotency_key %q call_id %v destination %q; want %s-1, NULL, payments",
				effs[0].idempotencyKey, effs[0].callID, effs[0].destination, ch[0].callID)
		}
	})

	t.Run("get_balance", func(t *testing.T) {
		res := u.call(t, "get_balance", map[string]any{"customer": "alice"}, nil)
		sc, _ := res.StructuredContent.(map[string]any)
		if res.IsError || sc["balance_cents"] != float64(1234) || sc["charges"] != float64(1) {
			t.Errorf("get_balance alice: %q %v, want 1234 cents in 1 charge", resultText(res), res.StructuredContent)
		}
		res = u.call(t, "get_balance", map[string]any{"customer": "nobody"}, nil)
		if sc, _ := res.StructuredContent.(map[string]any); res.IsError || sc["balance_cents"] != float64(0) {
			t.Errorf("get_balance nobody: %q %v, want 0", resultText(res), res.StructuredContent)
		}
	})

	t.Run("claimed set_nickname", func(t *testing.T) {
		args := map[string]any{"customer": "alice", "nickname": "Al"}
		c := u.insertClaim(t, "set_nickname", args)
		res := u.call(t, "set_nickname", args, c.meta())
		if res.IsError {
			t.Fatalf("set_nickname: %q", resultText(res))
		}
		checkContractRecorded(t, u, c, "completed", res)
		var nick string
		if err := u.db.Read.QueryRow(`SELECT nickname FROM nicknames WHERE customer = 'alice'`).Scan(&nick); err != nil || nick != "Al" {
			t.Errorf("nickname of alice: %q %v, want Al", nick, err)
		}
	})
}

// A non-cooperating upstream ignores the claim: it writes its business rows
// only, and the proxy has to find out the outcome another way.
func TestUpstreamContractNonCooperating(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, contractUpstreamKinds(), testUpstreamContractNonCooperating)
}

func testUpstreamContractNonCooperating(t *testing.T, up upstreamKind) {
	u := startContractUpstream(t, up, "UPSTREAM_COOPERATE=0")
	if !strings.Contains(u.ready, " cooperate=0") {
		t.Errorf("ready line %q, want cooperate=0", u.ready)
	}
	args := map[string]any{"customer": "erin", "amount_cents": 900}
	c := u.insertClaim(t, "charge", args)
	res := u.call(t, "charge", args, c.meta())
	if res.IsError {
		t.Fatalf("charge: tool error %q", resultText(res))
	}
	checkContractInFlight(t, u, c)
	if ch := u.charges(t, "erin"); len(ch) != 1 || ch[0].amountCents != 900 {
		t.Errorf("charges of erin: %+v, want one of 900", ch)
	}
	if n := u.countEffects(t); n != 0 {
		t.Errorf("effects: %d, want none", n)
	}

	res = u.call(t, "charge", map[string]any{"customer": "erin", "amount_cents": 0}, c.meta())
	if !res.IsError || resultText(res) != "amount out of range" {
		t.Errorf("charge of 0: %q (isError %v), want tool error \"amount out of range\"", resultText(res), res.IsError)
	}
	checkContractInFlight(t, u, c)
	if ch := u.charges(t, "erin"); len(ch) != 1 {
		t.Errorf("charges of erin after a failed charge: %d, want 1", len(ch))
	}
}

// slow_charge reports progress when asked, then charges like charge.
func TestUpstreamContractProgress(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, contractUpstreamKinds(), testUpstreamContractProgress)
}

func testUpstreamContractProgress(t *testing.T, up upstreamKind) {
	dbPath := filepath.Join(t.TempDir(), "shared.db")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := schema.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	progress := make(chan *mcp.ProgressNotificationParams, 4)
	client := mcp.NewClient(&mcp.Implementation{Name: "contract-test", Version: "v0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params
		},
	})
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: up.command(t, dbPath)}, nil)
	if err != nil {
		t.Fatalf("connect to the %s upstream: %v", up.name, err)
	}
	defer cs.Close()
	u := &contractUpstream{db: db, cs: cs}

	args := map[string]any{"customer": "frank", "amount_cents": 42, "delay_ms": 50}
	c := u.insertClaim(t, "slow_charge", args)
	params := &mcp.CallToolParams{Name: "slow_charge", Arguments: args, Meta: c.meta()}
	params.SetProgressToken("tok-1")
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("slow_charge: %v", err)
	}
	if res.IsError {
		t.Fatalf("slow_charge: tool error %q", resultText(res))
	}
	checkContractRecorded(t, u, c, "completed", res)
	select {
	case p := <-progress:
		if p.ProgressToken != "tok-1" {
			t.Errorf("progress token %v, want tok-1", p.ProgressToken)
		}
	case <-ctx.Done():
		t.Fatal("no progress notification")
	}
	if n := len(u.effects(t, c.uid)); n != 1 {
		t.Errorf("effects of the slow charge: %d, want 1", n)
	}
}

// A charge's slow work (UPSTREAM_CHARGE_DELAY_MS) does not end when the
// client cancels: the charge still tries to commit, and the fence decides.
// While the claim is still the attempt's, it commits; once a retry has
// taken the call over, it rolls back and the retry's charge is the one. The
// upstream goes on serving either way (the Python SDK answers a cancelled
// request itself, and a handler that then returned normally used to end
// the whole server: python-sdk#2416).
func TestUpstreamContractCancelledCharge(t *testing.T) {
	t.Parallel()
	forEachUpstream(t, contractUpstreamKinds(), testUpstreamContractCancelledCharge)
}

func testUpstreamContractCancelledCharge(t *testing.T, up upstreamKind) {
	const delay = time.Second
	u := startContractUpstream(t, up, "UPSTREAM_CHARGE_DELAY_MS="+strconv.FormatInt(delay.Milliseconds(), 10))

	// cancelledCharge sends a claimed charge and cancels it (the go-sdk
	// client sends notifications/cancelled) well before its slow work ends.
	cancelledCharge := func(t *testing.T, args map[string]any, c contractClaim) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if res, err := u.cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: args, Meta: c.meta()}); err == nil {
			t.Fatalf("the charge answered %q within 300 ms; want the client's timeout while it waits %s", resultText(res), delay)
		}
	}

	t.Run("commits", func(t *testing.T) {
		args := map[string]any{"customer": "gina", "amount_cents": 321}
		c := u.insertClaim(t, "charge", args)
		cancelledCharge(t, args, c)
		pollUntil(t, 30*time.Second, "the cancelled charge's commit", func() bool {
			return u.readCall(t, c.rowID).state != "in_flight"
		})
		r := u.readCall(t, c.rowID)
		if r.state != "completed" || !r.result.Valid {
			t.Fatalf("calls row of the cancelled charge: state %q result %v, want completed", r.state, r.result)
		}
		if ch := u.charges(t, "gina"); len(ch) != 1 || ch[0].callID != c.uid {
			t.Errorf("charges of gina: %+v, want one under %s", ch, c.uid)
		}
		if n := len(u.effects(t, c.uid)); n != 1 {
			t.Errorf("effects of the cancelled charge: %d, want 1", n)
		}
		// Still serving, on the same connection.
		bal := u.call(t, "get_balance", map[string]any{"customer": "gina"}, nil)
		if sc, _ := bal.StructuredContent.(map[string]any); bal.IsError || sc["balance_cents"] != float64(321) {
			t.Errorf("get_balance gina after the cancelled charge: %q %v, want 321", resultText(bal), bal.StructuredContent)
		}
	})

	t.Run("taken over", func(t *testing.T) {
		args := map[string]any{"customer": "hal", "amount_cents": 654}
		c := u.insertClaim(t, "charge", args)
		cancelledCharge(t, args, c)
		// A retry takes the call over, as the proxy does when the
		// attempt's lease has expired, and runs the charge again. Its
		// slow work is as long and began later, so the first attempt's
		// transaction comes first, and finds the claim gone.
		retry := c
		retry.owner = "contract-test/retry#2"
		if _, err := u.db.Write.Exec(`UPDATE calls SET owner = ?, attempts = attempts + 1 WHERE id = ? AND owner = ?`,
			retry.owner, c.rowID, c.owner); err != nil {
			t.Fatal(err)
		}
		res := u.call(t, "charge", args, retry.meta())
		if res.IsError {
			t.Fatalf("the retry's charge: tool error %q", resultText(res))
		}
		checkContractRecorded(t, u, retry, "completed", res)
		sc, _ := res.StructuredContent.(map[string]any)
		if ch := u.charges(t, "hal"); len(ch) != 1 || float64(ch[0].id) != sc["chargeId"] {
			t.Errorf("charges of hal: %+v, want exactly the retry's (%v)", ch, sc["chargeId"])
		}
		if n := len(u.effects(t, c.uid)); n != 1 {
			t.Errorf("effects of the call: %d, want 1", n)
		}
	})
}
