package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// newEffectsDB makes n charges through the outbox layer on a new database
// file, each enqueueing one pending effect to destination payments (ids 1
// to n), and returns the file's path and a handle on it for the test's own
// checks. The layer's database is closed: operator commands come from
// another process.
func newEffectsDB(t *testing.T, n int) (string, *sql.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db, err := schema.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := ledger.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	layer, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	server := layer.NewServer(&mcp.Implementation{Name: "operate-test", Version: "v0"}, nil)
	ledger.Register(layer, server, nil)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "operate-test-client", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		mustSucceed(t, cs, chargeCall(fmt.Sprintf("operate-%d", i), 100*i))
	}
	cs.Close()
	ss.Wait()
	check := openLedgerDB(t, path)
	if got := countRows(t, check, `SELECT count(*) FROM effects WHERE state = 'pending' AND id BETWEEN 1 AND ?`, n); got != n {
		t.Fatalf("%d pending effects with ids 1..%d, want %d", got, n, n)
	}
	return path, check
}

// farFuture is a next attempt time no test reaches, so that a retry's
// "due now" is visible.
var farFuture = time.Now().Add(time.Hour).UnixMilli()

// setEffect puts effect id into state as the dispatcher would have left it
// (the columns each state implies), at destination dest.
func setEffect(t *testing.T, db *sql.DB, id int64, state, dest string) {
	t.Helper()
	now := time.Now().UnixMilli()
	c := struct {
		owner            string
		leaseUntil       int64
		sent, delivered  any
		attempts, status int
		lastError        string
		nextAttempt      int64
	}{attempts: 1, nextAttempt: now}
	switch state {
	case "pending":
		c.attempts, c.status, c.lastError, c.nextAttempt = 2, 503, "HTTP 503", farFuture
	case "in_flight":
		c.owner, c.leaseUntil = "dispatch-operate-test", farFuture
	case "delivered":
		c.delivered, c.status = now, 200
	case "dead":
		c.status, c.lastError = 400, "HTTP 400: the destination refused the request"
	case "unknown":
		c.sent, c.lastError, c.nextAttempt = now, "no response after the request was sent: timed out", farFuture
	case "cancelled":
		c.lastError = "cancelled by an operator"
	default:
		t.Fatalf("setEffect: no state %q", state)
	}
	_, err := db.Exec(`
UPDATE effects SET state = ?, destination = ?, lease_owner = ?, lease_until = ?, send_started_at = ?, delivered_at = ?,
    attempts = ?, last_status = ?, last_error = ?, next_attempt_at = ?, updated_at = ?
WHERE id = ?`, state, dest, c.owner, c.leaseUntil, c.sent, c.delivered, c.attempts, c.status, c.lastError, c.nextAttempt, now, id)
	if err != nil {
		t.Fatalf("set effect %d %s: %v", id, state, err)
	}
}

// effectRecord is what the tests check of an effect on disk.
type effectRecord struct {
	state, leaseOwner string
	attempts          int
	next              int64
	delivered         sql.NullInt64
}

func readEffectRecord(t *testing.T, db *sql.DB, id int64) effectRecord {
	t.Helper()
	var e effectRecord
	err := db.QueryRow(`SELECT state, lease_owner, attempts, next_attempt_at, delivered_at FROM effects WHERE id = ?`, id).
		Scan(&e.state, &e.leaseOwner, &e.attempts, &e.next, &e.delivered)
	if err != nil {
		t.Fatalf("read effect %d: %v", id, err)
	}
	return e
}

func stateOf(t *testing.T, db *sql.DB, id int64) string {
	t.Helper()
	return readEffectRecord(t, db, id).state
}

// allStates is the fixture's layout: effect i+1 is in allStates[i].
var allStates = []string{"pending", "in_flight", "delivered", "dead", "unknown", "cancelled"}

// newStatesDB is a database with one effect in each state (ids 1 to 6 in
// the order of allStates) at destination payments, and a second dead one
// (id 7) at destination mailer.
func newStatesDB(t *testing.T) (string, *sql.DB) {
	t.Helper()
	path, db := newEffectsDB(t, 7)
	for i, s := range allStates {
		setEffect(t, db, int64(i+1), s, "payments")
	}
	setEffect(t, db, 7, "dead", "mailer")
	return path, db
}

// actionOutcomes is what each operator action does to an effect in each
// state, written out here rather than taken from effectActions so that the
// test checks the help text's claims against the library.
var actionOutcomes = []struct {
	args []string // the command line after "outbox", ID as "%d"
	to   map[string]string
}{
	{[]string{"retry", "%d"}, map[string]string{"dead": "pending", "unknown": "pending", "pending": "pending", "cancelled": "pending"}},
	{[]string{"cancel", "%d"}, map[string]string{"pending": "cancelled", "dead": "cancelled", "unknown": "cancelled"}},
	{[]string{"resolve", "%d", "delivered"}, map[string]string{"unknown": "delivered", "dead": "delivered"}},
	{[]string{"resolve", "%d", "retry"}, map[string]string{"unknown": "pending", "dead": "pending"}},
}

// frontend runs an action through the command line or the API and
// reports whether it was done, or refused because of the effect's state
// (with the message); anything else fails the test.
type frontend struct {
	name string
	do   func(t *testing.T, dbPath string, args []string) (done bool, msg string)
}

var cliFrontend = frontend{"cli", func(t *testing.T, dbPath string, args []string) (bool, string) {
	t.Helper()
	// Flags after the arguments work too.
	r := runCLI(t, nil, append(append([]string{"outbox"}, args...), "--db", dbPath)...)
	switch r.code {
	case 0:
		return true, r.stdout
	case 1:
		return false, r.stderr
	}
	t.Fatalf("outbox %v: exit %d, stderr %q", args, r.code, r.stderr)
	return false, ""
}}

// TestEffectActionStates runs every action on an effect in every state,
// through both front ends: each must do exactly what actionOutcomes says,
// refuse the rest naming the current state, and leave a refused effect
// untouched.
func TestEffectActionStates(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 1)
	admin := newAdminFixture(t, path)
	for _, fe := range []frontend{cliFrontend, admin.frontend()} {
		for _, ac := range actionOutcomes {
			for _, from := range allStates {
				name := fmt.Sprintf("%s/%s/%s", fe.name, ac.args[0], from)
				if len(ac.args) == 3 {
					name += "/" + ac.args[2]
				}
				setEffect(t, db, 1, from, "payments")
				before := readEffectRecord(t, db, 1)
				args := slices.Clone(ac.args)
				args[1] = "1"
				done, msg := fe.do(t, path, args)
				after := readEffectRecord(t, db, 1)
				want, applies := ac.to[from]
				switch {
				case applies && !done:
					t.Errorf("%s: refused (%s), want %s", name, msg, want)
				case !applies && done:
					t.Errorf("%s: done (now %s), want refused", name, after.state)
				case applies && after.state != want:
					t.Errorf("%s: effect is %s, want %s", name, after.state, want)
				case !applies && after != before:
					t.Errorf("%s: refused but the effect changed: %+v -> %+v", name, before, after)
				case !applies && !strings.Contains(msg, "effect 1 is "+from):
					t.Errorf("%s: refusal %q does not name the state %s", name, msg, from)
				}
				if applies && want == "pending" && (after.attempts != 0 || after.next > time.Now().UnixMilli()) {
					t.Errorf("%s: retried effect has attempts %d, next %d; want a fresh budget, due now", name, after.attempts, after.next)
				}
				if applies && want == "delivered" && !after.delivered.Valid {
					t.Errorf("%s: resolved as delivered without a delivery time", name)
				}
			}
		}
	}
	// The table that help and errors quote says the same as the library.
	for _, ac := range actionOutcomes[:3] {
		a, ok := operate.FindEffectAction(ac.args[0])
		if !ok {
			t.Fatalf("no action %s", ac.args[0])
		}
		var want []string
		for _, s := range allStates {
			if _, ok := ac.to[s]; ok {
				want = append(want, s)
			}
		}
		got := slices.Sorted(slices.Values(a.From()))
		if slices.Sort(want); !slices.Equal(got, want) {
			t.Errorf("action %s claims to apply to %v, the library applies it to %v", a.Name(), got, want)
		}
	}
}

func TestOutboxCLIActions(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	vars := map[string]string{"MCP_OUTBOX_DB": path}

	t.Run("no such effect", func(t *testing.T) {
		r := runCLI(t, vars, "outbox", "retry", "42")
		if r.code != 1 || !strings.Contains(r.stderr, "effect 42: no such effect") {
			t.Errorf("retry 42: exit %d, stderr %q; want exit 1, effect 42: no such effect", r.code, r.stderr)
		}
	})

	t.Run("wrong state", func(t *testing.T) {
		r := runCLI(t, vars, "outbox", "cancel", "3")
		if r.code != 1 || !strings.Contains(r.stderr, "effect 3 is delivered") || !strings.Contains(r.stderr, "pending, dead or unknown") {
			t.Errorf("cancel a delivered effect: exit %d, stderr %q; want exit 1 naming the state and what cancel applies to", r.code, r.stderr)
		}
		if s := stateOf(t, db, 3); s != "delivered" {
			t.Errorf("effect 3 is %s after a refused cancel", s)
		}
	})

	t.Run("usage errors change nothing", func(t *testing.T) {
		before := readEffectRecord(t, db, 5)
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"retry"}, "give one effect ID, or --dead"},
			{[]string{"retry", "abc"}, `effect id "abc": want a positive integer`},
			{[]string{"retry", "0"}, `effect id "0"`},
			{[]string{"retry", "5", "--dead"}, "not both"},
			{[]string{"retry", "5", "6"}, "give one effect ID"},
			{[]string{"cancel"}, "give one effect ID"},
			{[]string{"resolve", "5"}, "give an effect ID and delivered or retry"},
			{[]string{"resolve", "5", "maybe"}, `outcome "maybe": want delivered`},
			{[]string{"resolve", "--", "-5", "retry"}, `effect id "-5"`},
			{[]string{"list", "--state", "done"}, `state "done": want one of pending, in_flight, delivered, dead, unknown, cancelled`},
			{[]string{"list", "--limit", "0"}, "limit 0: want 1 to 1000"},
			{[]string{"list", "extra"}, `unexpected argument "extra"`},
			{[]string{"summary", "--no-such-flag"}, "flag provided but not defined"},
			{[]string{}, "give a subcommand"},
			{[]string{"frobnicate"}, `unknown subcommand "frobnicate"`},
		} {
			r := runCLI(t, vars, append([]string{"outbox"}, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "mcp-outbox outbox --help") {
				t.Errorf("outbox %v: exit %d, stderr %q; want exit 2 and %q", tc.args, r.code, r.stderr, tc.want)
			}
		}
		if after := readEffectRecord(t, db, 5); after != before {
			t.Errorf("effect 5 changed: %+v -> %+v", before, after)
		}
	})

	t.Run("retry unknown warns", func(t *testing.T) {
		r := runCLI(t, nil, "outbox", "retry", "--db", path, "5")
		if r.code != 0 || !strings.Contains(r.stdout, "effect 5 (POST /v1/charges to payments): was unknown, now pending") {
			t.Fatalf("retry 5: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stderr, "warning: effect 5 was unknown and will be sent again") {
			t.Errorf("retrying an unknown effect did not warn: %q", r.stderr)
		}
		if s := stateOf(t, db, 5); s != "pending" {
			t.Errorf("effect 5 is %s, want pending", s)
		}
	})

	t.Run("retry dead", func(t *testing.T) {
		r := runCLI(t, vars, "outbox", "retry", "--dead")
		if r.code != 0 || r.stdout != "retried 2 dead effects\n" {
			t.Fatalf("retry --dead: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		for _, id := range []int64{4, 7} {
			if s := stateOf(t, db, id); s != "pending" {
				t.Errorf("effect %d is %s after retry --dead, want pending", id, s)
			}
		}
		if s := stateOf(t, db, 6); s != "cancelled" {
			t.Errorf("retry --dead touched the cancelled effect: %s", s)
		}
	})
}

// TestOutboxCLIMissingDatabase: every subcommand refuses a file that does
// not exist, and creates none.
func TestOutboxCLIMissingDatabase(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "typo.db")
	for _, args := range [][]string{{"list"}, {"summary"}, {"retry", "1"}, {"retry", "--dead"}, {"cancel", "1"}, {"resolve", "1", "delivered"},
		{"calls"}, {"resolve-call", "--key", "k", "--outcome", "rerun"}} {
		r := runCLI(t, map[string]string{"MCP_OUTBOX_DB": missing}, append([]string{"outbox"}, args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, missing+" does not exist") {
			t.Errorf("outbox %v: exit %d, stderr %q; want exit 1 saying the file does not exist", args, r.code, r.stderr)
		}
		if _, err := os.Stat(missing); err == nil {
			t.Fatalf("outbox %v created the database file", args)
		}
	}
}

// tableIDs returns the first column of a list table's rows.
func tableIDs(t *testing.T, out string) []int64 {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "ID ") {
		t.Fatalf("table has no header:\n%s", out)
	}
	var ids []int64
	for _, l := range lines[1:] {
		id, err := strconv.ParseInt(strings.Fields(l)[0], 10, 64)
		if err != nil {
			t.Fatalf("row %q does not start with an id", l)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestOutboxCLIList(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	// A destination's error text may hold anything, terminal escapes and
	// bidirectional overrides too.
	long := "HTTP 400: \x1b[31mred\x1b[0m a\u202egpj.exe " + strings.Repeat("x", 200)
	if _, err := db.Exec(`UPDATE effects SET last_error = ? WHERE id = 4`, long); err != nil {
		t.Fatal(err)
	}
	list := func(t *testing.T, args ...string) cliResult {
		t.Helper()
		r := runCLI(t, nil, append([]string{"outbox", "list", "--db", path}, args...)...)
		if r.code != 0 {
			t.Fatalf("list %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
		return r
	}

	t.Run("table", func(t *testing.T) {
		out := list(t).stdout
		if ids := tableIDs(t, out); !slices.Equal(ids, []int64{7, 6, 5, 4, 3, 2, 1}) {
			t.Errorf("ids %v, want all seven newest first:\n%s", ids, out)
		}
		for _, want := range []string{"STATE", "POST /v1/charges", "operate-1", "HTTP 400:  [31mred [0m a<U+202E>gpj.exe xxx", "…", "delivered 20", "next 20", "mailer"} {
			if !strings.Contains(out, want) {
				t.Errorf("table does not contain %q:\n%s", want, out)
			}
		}
		if strings.ContainsAny(out, "\x1b\u202e") || strings.Contains(out, strings.Repeat("x", 100)) {
			t.Errorf("table carries the raw or unshortened error:\n%q", out)
		}
	})

	t.Run("by state", func(t *testing.T) {
		for _, s := range allStates {
			out := list(t, "--state", s).stdout
			want := []int64{int64(slices.Index(allStates, s) + 1)}
			if s == "dead" {
				want = []int64{7, 4}
			}
			if ids := tableIDs(t, out); !slices.Equal(ids, want) {
				t.Errorf("list --state %s: ids %v, want %v:\n%s", s, ids, want, out)
			}
		}
	})

	t.Run("by destination and limit", func(t *testing.T) {
		if ids := tableIDs(t, list(t, "--dest", "mailer").stdout); !slices.Equal(ids, []int64{7}) {
			t.Errorf("list --dest mailer: %v, want [7]", ids)
		}
		if ids := tableIDs(t, list(t, "--limit", "2").stdout); !slices.Equal(ids, []int64{7, 6}) {
			t.Errorf("list --limit 2: %v, want [7 6]", ids)
		}
		if out := list(t, "--dest", "nowhere").stdout; out != "no effects\n" {
			t.Errorf("list of nothing: %q", out)
		}
	})

	t.Run("json", func(t *testing.T) {
		var rows []map[string]any
		out := list(t, "--json", "--state", "dead").stdout
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("list --json: %v\n%s", err, out)
		}
		if len(rows) != 2 || rows[0]["id"] != 7.0 || rows[1]["id"] != 4.0 || rows[1]["lastError"] != long ||
			rows[1]["state"] != "dead" || rows[1]["idempotencyKey"] == "" || rows[1]["callKey"] != "operate-4" {
			t.Errorf("list --json --state dead: %s", out)
		}
		if strings.ContainsRune(out, '\u202e') || !strings.Contains(out, `a\u202egpj.exe`) {
			t.Errorf("list --json shows the override raw, not as \\u202e: %s", out)
		}
		if out := list(t, "--json", "--dest", "nowhere").stdout; strings.TrimSpace(out) != "[]" {
			t.Errorf("empty list as JSON: %q, want []", out)
		}
	})
}

func TestOutboxCLISummary(t *testing.T) {
	t.Parallel()
	path, _ := newStatesDB(t)
	r := runCLI(t, map[string]string{"MCP_OUTBOX_DB": path}, "outbox", "summary", "--json")
	var got map[string]int
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil {
		t.Fatalf("summary --json: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	want := map[string]int{"pending": 1, "in_flight": 1, "delivered": 1, "dead": 2, "unknown": 1, "cancelled": 1, "total": 7, "unknownCalls": 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("summary %v, want %v", got, want)
	}
	r = runCLI(t, nil, "outbox", "summary", "--db", path)
	words := strings.Join(strings.Fields(r.stdout), " ")
	for _, want := range []string{"pending 1 in_flight 1 delivered 1 dead 2 unknown 1 cancelled 1 total 7", "2 dead and 1 unknown effects need an operator",
		"unknown calls: 0"} {
		if r.code != 0 || !strings.Contains(words, want) {
			t.Errorf("summary: exit %d, stdout %q; want %q", r.code, r.stdout, want)
		}
	}
}

func TestOutboxCLIHelp(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "outbox", "--help")
	if r.code != 0 {
		t.Fatalf("outbox --help: exit %d", r.code)
	}
	for _, want := range append(slices.Clone(allStates), "sends its request again", "at_most_once", "retry --dead", "resolve ID delivered",
		"resolve-call --key K", "outcome unknown", "completed", "rerun") {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("outbox --help does not mention %q", want)
		}
	}
	for _, s := range outboxSubs() {
		for _, args := range [][]string{{s.name, "--help"}, {"help", s.name}} {
			r := runCLI(t, nil, append([]string{"outbox"}, args...)...)
			if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Usage: mcp-outbox outbox "+s.name) || !strings.Contains(r.stdout, "-db file") {
				t.Errorf("outbox %v: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
			}
		}
	}
	if r := runCLI(t, nil, "outbox", "retry", "--help"); !strings.Contains(r.stdout, "SENDS IT AGAIN") {
		t.Errorf("retry --help does not say that an unknown effect is sent again:\n%s", r.stdout)
	}
}

// addUnknownCall writes a call in state unknown, as a proxy leaves one
// whose outcome was lost, created at the given unix ms.
func addUnknownCall(t *testing.T, db *sql.DB, principal, key string, created int64) {
	t.Helper()
	_, err := db.Exec(`
INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, attempts, created_at, expires_at, on_lost)
VALUES (?, ?, ?, 'meta', 'charge', 'hash', 'unknown', 2, ?, ?, 'unknown')`,
		"call_"+principal+"_"+key, principal, key, created, created+24*3600*1000)
	if err != nil {
		t.Fatalf("add unknown call %s: %v", key, err)
	}
}

// callStateOf is what the tests check of a call on disk; state is "" when
// there is no such call.
func callStateOf(t *testing.T, db *sql.DB, principal, key string) (state, result string) {
	t.Helper()
	var res sql.NullString
	err := db.QueryRow(`SELECT state, result FROM calls WHERE principal = ? AND key = ?`, principal, key).Scan(&state, &res)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return state, res.String
}

func TestOutboxCLIUnknownCalls(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 1) // call operate-1 is completed
	vars := map[string]string{"MCP_OUTBOX_DB": path}
	if r := runCLI(t, vars, "outbox", "calls"); r.code != 0 || r.stdout != "no unknown calls\n" {
		t.Errorf("calls with none: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	addUnknownCall(t, db, "local", "lost-2", base+2000)
	addUnknownCall(t, db, "local", "lost-1", base+1000)
	addUnknownCall(t, db, "user:alice", "lost-1", base+3000)
	addUnknownCall(t, db, "local", "lost-3", base+4000)

	t.Run("list", func(t *testing.T) {
		r := runCLI(t, vars, "outbox", "calls")
		if r.code != 0 {
			t.Fatalf("calls: exit %d, stderr %q", r.code, r.stderr)
		}
		lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
		if len(lines) != 6 || !strings.HasPrefix(lines[0], "PRINCIPAL") || !strings.Contains(lines[5], "resolve-call --key KEY") {
			t.Fatalf("calls: want a header, four rows and a hint:\n%s", r.stdout)
		}
		for i, want := range [][]string{
			{"local", "lost-1", "charge", "2", "2026-12-01", "10:00:01", "call_local_lost-1"},
			{"local", "lost-2"},
			{"user:alice", "lost-1"},
			{"local", "lost-3"},
		} {
			if got := strings.Fields(lines[i+1]); !slices.Equal(got[:len(want)], want) {
				t.Errorf("row %d: %v, want %v (oldest first)", i+1, got, want)
			}
		}
		r = runCLI(t, vars, "outbox", "calls", "--json", "--limit", "1")
		var rows []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || r.code != 0 {
			t.Fatalf("calls --json: exit %d, %v\n%s", r.code, err, r.stdout)
		}
		if len(rows) != 1 || rows[0]["principal"] != "local" || rows[0]["key"] != "lost-1" || rows[0]["tool"] != "charge" ||
			rows[0]["attempts"] != 2.0 || rows[0]["createdAt"] != "2026-12-01T10:00:01Z" || rows[0]["callId"] != "call_local_lost-1" {
			t.Errorf("calls --json --limit 1: %s", r.stdout)
		}
	})

	t.Run("summary", func(t *testing.T) {
		r := runCLI(t, vars, "outbox", "summary")
		if r.code != 0 || !strings.Contains(r.stdout, "unknown calls: 4\n") || !strings.Contains(r.stdout, "4 unknown calls need an operator: mcp-outbox outbox calls") {
			t.Errorf("summary: exit %d, stdout %q", r.code, r.stdout)
		}
		r = runCLI(t, vars, "outbox", "summary", "--json")
		var got map[string]int
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got["unknownCalls"] != 4 {
			t.Errorf("summary --json: %v, %s", err, r.stdout)
		}
	})

	t.Run("refusals change nothing", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"--key", "nobody", "--outcome", "rerun"}, 1, `call "nobody" of local: no such call`},
			{[]string{"--key", "lost-3", "--principal", "user:bob", "--outcome", "rerun"}, 1, `call "lost-3" of user:bob: no such call`},
			{[]string{"--key", "operate-1", "--outcome", "rerun"}, 1, `call "operate-1" of local is completed: only a call in state unknown can be resolved`},
			{[]string{"--key", "lost-1", "--outcome", "maybe"}, 2, `outcome "maybe": want completed, failed or rerun`},
			{[]string{"--key", "lost-1"}, 2, `outcome "": want completed`},
			{[]string{"--outcome", "rerun"}, 2, "key: invalid idempotency key: empty"},
			{[]string{"--key", "lost-1", "--outcome", "completed", "--note", strings.Repeat("n", 1001)}, 2, "note: 1001 bytes, the limit is 1000"},
			{[]string{"--key", "lost-1", "--principal", "", "--outcome", "rerun"}, 2, "principal: empty"},
			{[]string{"lost-1", "--outcome", "rerun"}, 2, `unexpected argument "lost-1"`},
			{[]string{"--call-id", "call_local_lost-1", "--key", "lost-1", "--outcome", "rerun"}, 2, "not both"},
			{[]string{"--call-id", "bad id", "--outcome", "rerun"}, 2, `call id "bad id"`},
			{[]string{"--call-id", "call_nobody", "--outcome", "rerun"}, 1, "call call_nobody: no such call"},
		} {
			r := runCLI(t, vars, append([]string{"outbox", "resolve-call"}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("resolve-call %v: exit %d, stderr %q; want exit %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
			}
		}
		if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'unknown'`); n != 4 {
			t.Errorf("%d unknown calls after refusals, want 4", n)
		}
		if s, _ := callStateOf(t, db, "local", "operate-1"); s != "completed" {
			t.Errorf("operate-1 is %s", s)
		}
	})

	t.Run("resolve", func(t *testing.T) {
		r := runCLI(t, nil, "outbox", "resolve-call", "--db", path, "--key", "lost-1", "--outcome", "completed", "--note", "charge ch_1 is at the processor")
		if r.code != 0 || r.stdout != `call "lost-1" of local (charge, call_local_lost-1): was unknown, now completed`+"\n" {
			t.Fatalf("resolve-call completed: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if s, res := callStateOf(t, db, "local", "lost-1"); s != "completed" ||
			res != `{"content":[{"type":"text","text":"[resolved by an operator] charge ch_1 is at the processor"}]}` {
			t.Errorf("lost-1: %s %s", s, res)
		}
		r = runCLI(t, vars, "outbox", "resolve-call", "--key", "lost-1", "--principal", "alice", "--outcome", "failed")
		if r.code != 0 || !strings.Contains(r.stdout, "now failed") {
			t.Fatalf("resolve-call failed: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if s, res := callStateOf(t, db, "user:alice", "lost-1"); s != "failed" ||
			res != `{"content":[{"type":"text","text":"[resolved by an operator]"}],"isError":true}` {
			t.Errorf("alice's lost-1: %s %s", s, res)
		}
		r = runCLI(t, vars, "outbox", "resolve-call", "--key", "lost-2", "--outcome", "rerun")
		if r.code != 0 || !strings.Contains(r.stdout, "was unknown, forgotten: the next retry with its key runs it") {
			t.Fatalf("resolve-call rerun: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if s, _ := callStateOf(t, db, "local", "lost-2"); s != "" {
			t.Errorf("lost-2 resolved as rerun is still there: %s", s)
		}
		// Resolved once; a second resolution is refused.
		r = runCLI(t, vars, "outbox", "resolve-call", "--key", "lost-1", "--outcome", "rerun")
		if r.code != 1 || !strings.Contains(r.stderr, "is completed") {
			t.Errorf("resolving twice: exit %d, stderr %q", r.code, r.stderr)
		}
		if r := runCLI(t, vars, "outbox", "calls", "--json"); !strings.Contains(r.stdout, `"key": "lost-3"`) || strings.Count(r.stdout, `"key"`) != 1 {
			t.Errorf("unknown calls left: %s, want lost-3 only", r.stdout)
		}
		// By call id, as 'outbox calls' and the status tool show it.
		r = runCLI(t, vars, "outbox", "resolve-call", "--call-id", "call_local_lost-3", "--outcome", "failed")
		if r.code != 0 || r.stdout != `call "lost-3" of local (charge, call_local_lost-3): was unknown, now failed`+"\n" {
			t.Errorf("resolve-call --call-id: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if r := runCLI(t, vars, "outbox", "calls"); r.stdout != "no unknown calls\n" {
			t.Errorf("unknown calls left: %q", r.stdout)
		}
	})
}
