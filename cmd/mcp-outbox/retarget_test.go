package main

import (
	"database/sql"
	"strings"
	"testing"
)

// destinationsOf lists each effect's destination and state, by id.
func destinationsOf(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT destination, state FROM effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var d, s string
		if err := rows.Scan(&d, &s); err != nil {
			t.Fatal(err)
		}
		out = append(out, d+":"+s)
	}
	return strings.Join(out, " ")
}

// The way out of a typo'd destination, from the command line: serve
// refuses to start and names the retarget command; bad input changes
// nothing; retarget moves the pending effects in one go, and serve then
// starts. cancel --dest cancels a destination's pending effects.
func TestOutboxRetarget(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 5)
	setEffect(t, db, 1, "delivered", "payments") // payments is known: it has delivered
	setEffect(t, db, 2, "pending", "paymnets")
	setEffect(t, db, 3, "pending", "paymnets")
	setEffect(t, db, 4, "dead", "paymnets") // not pending: left alone
	vars := map[string]string{"MCP_OUTBOX_DB": path}

	r := runCLI(t, vars, "serve", "--dest", "payments=http://127.0.0.1:1")
	if r.code != 2 || !strings.Contains(r.stderr, `pending for destinations the dispatcher does not know: "paymnets" (2)`) ||
		!strings.Contains(r.stderr, "mcp-outbox outbox retarget --from paymnets --to NAME") {
		t.Fatalf("serve with paymnets pending: exit %d, stderr %q; want exit 2 naming the retarget command", r.code, r.stderr)
	}

	before := destinationsOf(t, db)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"retarget"}, 2, "--from: give a destination name"},
		{[]string{"retarget", "--from", "paymnets"}, 2, "--to: give a destination name"},
		{[]string{"retarget", "--to", "payments"}, 2, "--from: give a destination name"},
		{[]string{"retarget", "--from", "paymnets", "--to", "paymnets"}, 2, `--from and --to are both "paymnets"`},
		{[]string{"retarget", "--from", "paymnets", "--to", "paymentz"}, 2,
			`--to "paymentz": no destination of that name is configured or was ever delivered to (known: "payments"); nothing was moved`},
		{[]string{"retarget", "--from", "paymnets", "--to", "payments", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"retarget", "--from", "payments-typo", "--to", "payments"}, 1,
			`no pending effects for that destination; pending effects are for "payments" (1), "paymnets" (2)`},
		{[]string{"cancel", "--dest", ""}, 2, "--dest: give a destination name"},
		{[]string{"cancel", "2", "--dest", "paymnets"}, 2, "give an effect ID or --dest, not both"},
		{[]string{"cancel", "--dest", "nowhere"}, 1, `cancel "nowhere": no pending effects`},
	} {
		r := runCLI(t, vars, append([]string{"outbox"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("outbox %q: exit %d, stderr %q; want exit %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
	if after := destinationsOf(t, db); after != before {
		t.Fatalf("refused commands changed effects: %s -> %s", before, after)
	}

	r = runCLI(t, vars, "outbox", "retarget", "--from", "paymnets", "--to", "payments")
	if r.code != 0 || r.stdout != "moved 2 pending effects from \"paymnets\" to \"payments\"\n" ||
		!strings.Contains(r.stderr, "operator action") || !strings.Contains(r.stderr, "action=retarget from=paymnets to=payments effects=2") {
		t.Fatalf("retarget: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	want := "payments:delivered payments:pending payments:pending paymnets:dead payments:pending"
	if got := destinationsOf(t, db); got != want {
		t.Errorf("after retarget: %s, want %s", got, want)
	}

	// A destination configured as serve reads it, that has delivered
	// nothing yet, is known too.
	withBilling := map[string]string{"MCP_OUTBOX_DB": path, "MCP_OUTBOX_DEST_BILLING": "http://127.0.0.1:1"}
	if r := runCLI(t, withBilling, "outbox", "retarget", "--from", "payments", "--to", "billing"); r.code != 0 {
		t.Fatalf("retarget to a configured destination: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, vars, "outbox", "cancel", "--dest", "billing")
	if r.code != 0 || r.stdout != "cancelled 3 pending effects of \"billing\"\n" || !strings.Contains(r.stderr, "action=cancel-destination destination=billing effects=3") {
		t.Fatalf("cancel --dest: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	want = "payments:delivered billing:cancelled billing:cancelled paymnets:dead billing:cancelled"
	if got := destinationsOf(t, db); got != want {
		t.Errorf("after cancel --dest: %s, want %s", got, want)
	}

	r = runCLI(t, nil, "outbox", "retarget", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "Usage: mcp-outbox outbox retarget --from NAME --to NAME") {
		t.Errorf("retarget --help: exit %d, stdout %q", r.code, r.stdout)
	}
	if r := runCLI(t, nil, "outbox", "--help"); !strings.Contains(r.stdout, "retarget --from NAME --to NAME") || !strings.Contains(r.stdout, "cancel --dest NAME") {
		t.Errorf("outbox --help does not list retarget and cancel --dest:\n%s", r.stdout)
	}
}
