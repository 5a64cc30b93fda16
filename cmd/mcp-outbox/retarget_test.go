package main

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/schema"
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
		{[]string{"retarget"}, 2, "from: give a destination name"},
		{[]string{"retarget", "--from", "paymnets"}, 2, "to: give a destination name"},
		{[]string{"retarget", "--to", "payments"}, 2, "from: give a destination name"},
		{[]string{"retarget", "--from", "paymnets", "--to", "paymnets"}, 2, `from and to are both "paymnets"`},
		{[]string{"retarget", "--from", "paymnets", "--to", "paymentz"}, 2,
			`to "paymentz": no destination of that name is configured or was ever delivered to (known: "payments"); nothing was moved ` +
				`(if "paymentz" is configured but has delivered nothing yet, give its URL as serve reads it: MCP_OUTBOX_DEST_PAYMENTZ=URL)`},
		{[]string{"retarget", "--from", "paymnets", "--to", "payments", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"retarget", "--from", "payments-typo", "--to", "payments"}, 1,
			`no pending effects for that destination; pending effects are for "payments" (1), "paymnets" (2)`},
		{[]string{"cancel", "--dest", ""}, 2, "cancel by destination: give a destination name"},
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

// The same way out through serve's admin API and operator page: the
// destinations serve's --dest names are the ones effects may be moved to;
// every change is logged as an admin or page action, and bad input
// changes nothing.
func TestRetargetAPIAndPage(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 5)
	for _, id := range []int64{2, 3} {
		setEffect(t, db, id, "pending", "paymnets")
	}
	setEffect(t, db, 4, "pending", "mailr")
	setEffect(t, db, 5, "pending", "mailr")
	sdb, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdb.Close() })
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	u, _ := url.Parse("http://127.0.0.1:1")
	layer, err := outbox.New(sdb, &outbox.Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	a := &app{db: sdb, server: mcp.NewServer(&mcp.Implementation{Name: "retarget-test", Version: "v0"}, nil), logger: logger,
		layer: layer, dests: []dispatch.Destination{{Name: "payments", URL: u}}}
	router := testRouter(t, a, logger)
	api := &adminFixture{db: sdb, router: router}
	before := destinationsOf(t, db)
	for _, tc := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/admin/effects/retarget", `{"from": "paymnets"}`, 400, "to: give a destination name"},
		{"/admin/effects/retarget", `{"from": "paymnets", "to": "paymnets"}`, 400, `from and to are both "paymnets"`},
		{"/admin/effects/retarget", `{"from": "paymnets", "to": "mailr"}`, 400, `to "mailr": no destination of that name is configured or was ever delivered to (known: "payments")`},
		{"/admin/effects/retarget", `{"from": "paymnets", "to": "payments", "force": true}`, 400, `unknown field "force"`},
		{"/admin/effects/retarget", `{"from": "nowhere", "to": "payments"}`, 404, "no pending effects for that destination"},
		{"/admin/effects/cancel-pending", `{}`, 400, "give a destination name"},
		{"/admin/effects/cancel-pending", `{"destination": "nowhere"}`, 404, `pending effects are for "mailr" (2), "payments" (1), "paymnets" (2)`},
	} {
		status, m := api.do(t, http.MethodPost, tc.path, tc.body)
		wantError(t, "POST "+tc.path+" "+tc.body, status, m, tc.status, tc.want)
	}
	if after := destinationsOf(t, db); after != before {
		t.Fatalf("refused requests changed effects: %s -> %s", before, after)
	}
	status, m := api.do(t, http.MethodPost, "/admin/effects/retarget", `{"from": "paymnets", "to": "payments"}`)
	if status != 200 || m["effects"] != 2.0 || m["to"] != "payments" {
		t.Fatalf("retarget: %d %v", status, m)
	}
	if !strings.Contains(logs.String(), `msg="admin action" action=retarget from=paymnets to=payments effects=2`) {
		t.Errorf("the retarget is not logged as an admin action:\n%s", logs.String())
	}

	// The page offers both actions for the destination its dispatcher
	// does not know, and does them.
	s := startPageServer(t, router)
	r := s.get(t, "/")
	wantContains(t, "unconfigured destination's actions", r.raw, `action="/effects/retarget"`, `name="from" value="mailr"`,
		`<option value="payments">payments</option>`, `action="/effects/cancel-pending"`, `name="destination" value="mailr"`)
	done, msg := flashOf(t, s.post(t, "/effects/retarget", url.Values{"from": {"mailr"}, "to": {"nowhere"}}))
	if done || !strings.Contains(msg, `to "nowhere": no destination of that name`) {
		t.Errorf("page retarget to an unknown destination: %v %q", done, msg)
	}
	done, msg = flashOf(t, s.post(t, "/effects/cancel-pending", url.Values{"destination": {"mailr"}}))
	if !done || msg != "Cancelled 2 pending effects of mailr." {
		t.Errorf("page cancel-pending: %v %q", done, msg)
	}
	if !strings.Contains(logs.String(), `msg="operator page action" action=cancel-destination destination=mailr effects=2`) {
		t.Errorf("the cancel is not logged as a page action:\n%s", logs.String())
	}
	want := "payments:pending payments:pending payments:pending mailr:cancelled mailr:cancelled"
	if got := destinationsOf(t, db); got != want {
		t.Errorf("after the API's retarget and the page's cancel: %s, want %s", got, want)
	}
	if r := s.get(t, "/"); strings.Contains(r.raw, `id="unconfigured"`) {
		t.Error("the page still reports an unconfigured destination")
	}
}
