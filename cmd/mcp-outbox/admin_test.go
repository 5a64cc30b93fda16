package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// adminFixture is the --http server's router on a database file, as serve
// builds it.
type adminFixture struct {
	db     *schema.DB
	router http.Handler
}

func newAdminFixture(t *testing.T, path string) *adminFixture {
	t.Helper()
	db, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := &app{db: db, server: mcp.NewServer(&mcp.Implementation{Name: "admin-test", Version: "v0"}, nil), logger: logger}
	return &adminFixture{db: db, router: testRouter(t, a, logger)}
}

// fromLoopback makes a request look like one from a client on this host;
// the tests' mods then change what they test.
func fromLoopback(r *http.Request) {
	r.RemoteAddr = "127.0.0.1:50123"
	r.Host = "127.0.0.1:8080"
}

// do sends a request to the router and returns the status and the JSON
// object answered; every answer must be one.
func (f *adminFixture) do(t *testing.T, method, target, body string, mods ...func(*http.Request)) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	fromLoopback(req)
	for _, m := range mods {
		m(req)
	}
	rec := httptest.NewRecorder()
	f.router.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, target, ct)
	}
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("%s %s: status %d, body is not a JSON object: %v\n%s", method, target, rec.Code, err, rec.Body)
	}
	return rec.Code, m
}

// frontend runs the matrix of TestEffectActionStates through the API.
func (f *adminFixture) frontend() frontend {
	return frontend{"api", func(t *testing.T, _ string, args []string) (bool, string) {
		t.Helper()
		body := ""
		if len(args) == 3 {
			body = fmt.Sprintf(`{"outcome": %q}`, args[2])
		}
		status, m := f.do(t, http.MethodPost, "/admin/effects/"+args[1]+"/"+args[0], body)
		msg, _ := m["error"].(string)
		switch status {
		case http.StatusOK:
			return true, ""
		case http.StatusConflict:
			return false, msg
		}
		t.Fatalf("POST %v: %d %v", args, status, m)
		return false, ""
	}}
}

func idsOf(t *testing.T, m map[string]any) []float64 {
	t.Helper()
	rows, ok := m["effects"].([]any)
	if !ok {
		t.Fatalf("no effects array in %v", m)
	}
	var ids []float64
	for _, r := range rows {
		ids = append(ids, r.(map[string]any)["id"].(float64))
	}
	return ids
}

func TestAdminReads(t *testing.T) {
	t.Parallel()
	path, _ := newStatesDB(t)
	f := newAdminFixture(t, path)

	status, m := f.do(t, http.MethodGet, "/admin/summary", "")
	want := map[string]any{"pending": 1.0, "in_flight": 1.0, "delivered": 1.0, "dead": 2.0, "unknown": 1.0, "cancelled": 1.0, "total": 7.0, "unknownCalls": 0.0}
	if status != http.StatusOK || fmt.Sprint(m) != fmt.Sprint(want) {
		t.Errorf("summary: %d %v, want %v", status, m, want)
	}

	for _, tc := range []struct {
		query string
		want  []float64
	}{
		{"", []float64{7, 6, 5, 4, 3, 2, 1}},
		{"?state=dead", []float64{7, 4}},
		{"?state=unknown", []float64{5}},
		{"?state=in_flight&dest=payments", []float64{2}},
		{"?dest=mailer", []float64{7}},
		{"?limit=3", []float64{7, 6, 5}},
		{"?state=dead&dest=nowhere", nil},
	} {
		status, m := f.do(t, http.MethodGet, "/admin/effects"+tc.query, "")
		if ids := idsOf(t, m); status != http.StatusOK || !slices.Equal(ids, tc.want) {
			t.Errorf("GET /admin/effects%s: %d, ids %v; want %v", tc.query, status, ids, tc.want)
		}
	}

	status, m = f.do(t, http.MethodGet, "/admin/effects/5", "")
	if status != http.StatusOK || m["id"] != 5.0 || m["state"] != "unknown" || m["callKey"] != "operate-5" || m["path"] != "/v1/charges" {
		t.Errorf("GET /admin/effects/5: %d %v", status, m)
	}

	for _, tc := range []struct {
		target string
		status int
		want   string
	}{
		{"/admin/effects/42", http.StatusNotFound, "effect 42: no such effect"},
		{"/admin/effects/abc", http.StatusBadRequest, `effect id "abc"`},
		{"/admin/effects?state=done", http.StatusBadRequest, `state "done": want one of`},
		{"/admin/effects?limit=0", http.StatusBadRequest, `limit "0"`},
		{"/admin/effects?limit=lots", http.StatusBadRequest, `limit "lots"`},
		{"/admin/effects?limit=1001", http.StatusBadRequest, `limit "1001"`},
		{"/admin/effects?status=dead", http.StatusBadRequest, `unknown parameter "status"`},
		{"/admin/effects?state=dead&state=unknown", http.StatusBadRequest, `"state" given 2 times`},
		{"/admin/nothing", http.StatusNotFound, "no such admin endpoint"},
	} {
		status, m := f.do(t, http.MethodGet, tc.target, "")
		wantError(t, "GET "+tc.target, status, m, tc.status, tc.want)
	}
	status, m = f.do(t, http.MethodGet, "/admin/effects/5/retry", "")
	wantError(t, "GET on an action", status, m, http.StatusMethodNotAllowed, "method GET not allowed")
}

func TestAdminActions(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	f := newAdminFixture(t, path)

	t.Run("retry unknown", func(t *testing.T) {
		status, m := f.do(t, http.MethodPost, "/admin/effects/5/retry", "")
		e, _ := m["effect"].(map[string]any)
		if status != http.StatusOK || m["previousState"] != "unknown" || e["state"] != "pending" || e["id"] != 5.0 {
			t.Fatalf("retry 5: %d %v", status, m)
		}
		if w, _ := m["warning"].(string); !strings.Contains(w, "sent again") {
			t.Errorf("retrying an unknown effect: no warning in %v", m)
		}
		if s := stateOf(t, db, 5); s != "pending" {
			t.Errorf("effect 5 is %s, want pending", s)
		}
	})

	t.Run("cancel with an empty object", func(t *testing.T) {
		status, m := f.do(t, http.MethodPost, "/admin/effects/1/cancel", "{}")
		if status != http.StatusOK || m["warning"] != nil || stateOf(t, db, 1) != "cancelled" {
			t.Errorf("cancel 1: %d %v, effect %s", status, m, stateOf(t, db, 1))
		}
	})

	t.Run("resolve delivered", func(t *testing.T) {
		status, m := f.do(t, http.MethodPost, "/admin/effects/4/resolve", `{"outcome": "delivered"}`)
		if status != http.StatusOK || stateOf(t, db, 4) != "delivered" {
			t.Errorf("resolve 4 delivered: %d %v, effect %s", status, m, stateOf(t, db, 4))
		}
	})

	t.Run("refusals change nothing", func(t *testing.T) {
		before := readEffectRecord(t, db, 7)
		big := `{"outcome": "` + strings.Repeat("x", operate.MaxAdminBody) + `"}`
		for _, tc := range []struct {
			target, body string
			status       int
			want         string
		}{
			{"/admin/effects/42/retry", "", http.StatusNotFound, "effect 42: no such effect"},
			{"/admin/effects/3/cancel", "", http.StatusConflict, "effect 3 is delivered; cancel applies only to pending, dead or unknown effects"},
			{"/admin/effects/6/resolve", `{"outcome": "retry"}`, http.StatusConflict, "effect 6 is cancelled; resolve applies only to unknown or dead effects"},
			{"/admin/effects/x/retry", "", http.StatusBadRequest, `effect id "x"`},
			{"/admin/effects/7/resolve", "", http.StatusBadRequest, `outcome "": want delivered`},
			{"/admin/effects/7/resolve", `{"outcome": "maybe"}`, http.StatusBadRequest, `outcome "maybe"`},
			{"/admin/effects/7/resolve", `{"outcome": "delivered", "force": true}`, http.StatusBadRequest, `unknown field "force"`},
			{"/admin/effects/7/resolve", `{"outcome": "delivered"} {}`, http.StatusBadRequest, "want one JSON object"},
			{"/admin/effects/7/resolve", `outcome=delivered`, http.StatusBadRequest, "body:"},
			{"/admin/effects/7/retry", `{"outcome": "delivered"}`, http.StatusBadRequest, `unknown field "outcome"`},
			{"/admin/effects/7/resolve", big, http.StatusRequestEntityTooLarge, "larger than 1048576 bytes"},
			{"/admin/effects/retry-dead", big, http.StatusRequestEntityTooLarge, "larger than"},
		} {
			status, m := f.do(t, http.MethodPost, tc.target, tc.body)
			wantError(t, "POST "+tc.target+" "+operate.Shorten(tc.body, 50), status, m, tc.status, tc.want)
		}
		if after := readEffectRecord(t, db, 7); after != before {
			t.Errorf("effect 7 changed: %+v -> %+v", before, after)
		}
		for id, s := range map[int64]string{3: "delivered", 6: "cancelled"} {
			if got := stateOf(t, db, id); got != s {
				t.Errorf("effect %d is %s after a refused action, want %s", id, got, s)
			}
		}
	})

	t.Run("retry dead", func(t *testing.T) {
		status, m := f.do(t, http.MethodPost, "/admin/effects/retry-dead", "")
		if status != http.StatusOK || m["retried"] != 1.0 || stateOf(t, db, 7) != "pending" {
			t.Errorf("retry-dead: %d %v, effect 7 %s; want 1 retried", status, m, stateOf(t, db, 7))
		}
	})
}

// TestAdminLoopbackOnly: until the API has authentication, a client that
// is not on this host, a request addressed to another name, and a
// cross-origin browser request are all refused, and change nothing.
func TestAdminLoopbackOnly(t *testing.T) {
	t.Parallel()
	path, db := newStatesDB(t)
	f := newAdminFixture(t, path)
	remote := func(addr string) func(*http.Request) { return func(r *http.Request) { r.RemoteAddr = addr } }
	header := func(k, v string) func(*http.Request) { return func(r *http.Request) { r.Header.Set(k, v) } }
	host := func(h string) func(*http.Request) { return func(r *http.Request) { r.Host = h } }

	for _, tc := range []struct {
		name   string
		mods   []func(*http.Request)
		status int
		want   string
	}{
		{"remote IPv4", []func(*http.Request){remote("192.0.2.7:40000")}, 403, "answers only clients on this host over loopback; 192.0.2.7 is not"},
		{"remote IPv6", []func(*http.Request){remote("[2001:db8::1]:40000")}, 403, "2001:db8::1 is not a loopback address"},
		{"forwarded header", []func(*http.Request){remote("192.0.2.7:40000"), header("X-Forwarded-For", "127.0.0.1"), header("X-Real-IP", "127.0.0.1")}, 403, "loopback"},
		{"rebound name", []func(*http.Request){host("attacker.example:8080")}, 403, `not "attacker.example:8080"`},
		{"cross-site browser", []func(*http.Request){header("Sec-Fetch-Site", "cross-site")}, 403, "cross-origin request refused"},
		{"foreign origin", []func(*http.Request){header("Origin", "http://attacker.example")}, 403, "cross-origin request refused"},
		{"IPv6 loopback", []func(*http.Request){remote("[::1]:40000"), host("[::1]:8080")}, 200, ""},
		{"localhost", []func(*http.Request){host("localhost:8080")}, 200, ""},
	} {
		status, m := f.do(t, http.MethodPost, "/admin/effects/4/cancel", "", tc.mods...)
		if tc.status == 200 {
			if status != 200 || stateOf(t, db, 4) != "cancelled" {
				t.Errorf("%s: %d %v, effect 4 %s; want it cancelled", tc.name, status, m, stateOf(t, db, 4))
			}
			setEffect(t, db, 4, "dead", "payments")
			continue
		}
		wantError(t, tc.name, status, m, tc.status, tc.want)
		if s := stateOf(t, db, 4); s != "dead" {
			t.Fatalf("%s: a refused request changed effect 4 to %s", tc.name, s)
		}
	}
	status, m := f.do(t, http.MethodGet, "/admin/summary", "", remote("198.51.100.1:1234"))
	wantError(t, "GET summary from afar", status, m, http.StatusForbidden, "loopback")
	status, m = f.do(t, http.MethodGet, "/admin/nothing", "", remote("198.51.100.1:1234"))
	wantError(t, "GET an unknown endpoint from afar", status, m, http.StatusForbidden, "loopback")
}

// TestAdminOverTCP: the --http server's router answers /admin to a real
// client on loopback, next to /mcp and /healthz.
func TestAdminOverTCP(t *testing.T) {
	t.Parallel()
	path, _ := newStatesDB(t)
	srv := httptest.NewServer(newAdminFixture(t, path).router)
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(srv.URL + "/admin/effects?state=unknown")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/effects: %d %v %v", resp.StatusCode, m, err)
	}
	if ids := idsOf(t, m); !slices.Equal(ids, []float64{5}) {
		t.Errorf("unknown effects over TCP: %v, want [5]", ids)
	}
	resp, err = client.Post(srv.URL+"/admin/effects/5/resolve", "application/json", strings.NewReader(`{"outcome":"retry"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST resolve over TCP: %d", resp.StatusCode)
	}
	if s := stateOf(t, openLedgerDB(t, path), 5); s != "pending" {
		t.Errorf("effect 5 is %s after resolve retry, want pending", s)
	}
}

func TestAdminUnknownCalls(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 1) // call operate-1 is completed
	f := newAdminFixture(t, path)
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	addUnknownCall(t, db, "local", "lost-2", base+2000)
	addUnknownCall(t, db, "local", "lost-1", base+1000)
	addUnknownCall(t, db, "user:alice", "lost-1", base+3000)

	keys := func(m map[string]any) []string {
		t.Helper()
		rows, ok := m["calls"].([]any)
		if !ok {
			t.Fatalf("no calls array in %v", m)
		}
		var out []string
		for _, r := range rows {
			c := r.(map[string]any)
			out = append(out, c["principal"].(string)+"/"+c["key"].(string))
		}
		return out
	}
	status, m := f.do(t, http.MethodGet, "/admin/calls/unknown", "")
	if got := keys(m); status != http.StatusOK || !slices.Equal(got, []string{"local/lost-1", "local/lost-2", "user:alice/lost-1"}) {
		t.Errorf("GET /admin/calls/unknown: %d %v, want the three oldest first", status, got)
	}
	row := m["calls"].([]any)[0].(map[string]any)
	if row["tool"] != "charge" || row["attempts"] != 2.0 || row["createdAt"] != "2026-12-01T10:00:01Z" || row["callId"] != "call_local_lost-1" {
		t.Errorf("first unknown call: %v", row)
	}
	if status, m := f.do(t, http.MethodGet, "/admin/calls/unknown?limit=1", ""); status != http.StatusOK || len(keys(m)) != 1 {
		t.Errorf("limit=1: %d %v", status, m)
	}
	if status, m := f.do(t, http.MethodGet, "/admin/summary", ""); status != http.StatusOK || m["unknownCalls"] != 3.0 {
		t.Errorf("summary: %d %v, want 3 unknown calls", status, m)
	}

	t.Run("refusals change nothing", func(t *testing.T) {
		for _, tc := range []struct {
			method, target, body string
			status               int
			want                 string
		}{
			{"GET", "/admin/calls/unknown?limit=0", "", http.StatusBadRequest, `limit "0"`},
			{"GET", "/admin/calls/unknown?state=dead", "", http.StatusBadRequest, `unknown parameter "state"`},
			{"POST", "/admin/calls/resolve", `{"key": "nobody", "outcome": "rerun"}`, http.StatusNotFound, `call "nobody" of local: no such call`},
			{"POST", "/admin/calls/resolve", `{"principal": "user:bob", "key": "lost-1", "outcome": "rerun"}`, http.StatusNotFound, "no such call"},
			{"POST", "/admin/calls/resolve", `{"key": "operate-1", "outcome": "failed"}`, http.StatusConflict, `call "operate-1" of local is completed`},
			{"POST", "/admin/calls/resolve", `{"key": "lost-1", "outcome": "maybe"}`, http.StatusBadRequest, `outcome "maybe": want completed, failed or rerun`},
			{"POST", "/admin/calls/resolve", `{"key": "lost-1"}`, http.StatusBadRequest, `outcome ""`},
			{"POST", "/admin/calls/resolve", "", http.StatusBadRequest, "key: invalid idempotency key: empty"},
			{"POST", "/admin/calls/resolve", `{"key": "lost-1", "outcome": "rerun", "force": true}`, http.StatusBadRequest, `unknown field "force"`},
			{"POST", "/admin/calls/resolve", `{"key": "lost-1", "outcome": "completed", "note": "` + strings.Repeat("n", 1001) + `"}`, http.StatusBadRequest, "note: 1001 bytes"},
			{"GET", "/admin/calls/resolve", "", http.StatusMethodNotAllowed, "method GET not allowed"},
			{"POST", "/admin/calls/resolve", `{"callId": "call_local_lost-2", "key": "lost-2", "outcome": "rerun"}`, http.StatusBadRequest, "not both"},
			{"POST", "/admin/calls/resolve", `{"callId": "call_local_lost-2", "principal": "local", "outcome": "rerun"}`, http.StatusBadRequest, "not both"},
			{"POST", "/admin/calls/resolve", `{"callId": "call nobody", "outcome": "rerun"}`, http.StatusBadRequest, `call id "call nobody"`},
			{"POST", "/admin/calls/resolve", `{"callId": "call_nobody", "outcome": "rerun"}`, http.StatusNotFound, "call call_nobody: no such call"},
		} {
			status, m := f.do(t, tc.method, tc.target, tc.body)
			wantError(t, tc.method+" "+tc.target+" "+operate.Shorten(tc.body, 50), status, m, tc.status, tc.want)
		}
		if n := countRows(t, db, `SELECT count(*) FROM calls WHERE state = 'unknown'`); n != 3 {
			t.Errorf("%d unknown calls after refusals, want 3", n)
		}
	})

	t.Run("resolve", func(t *testing.T) {
		status, m := f.do(t, http.MethodPost, "/admin/calls/resolve", `{"key": "lost-1", "outcome": "completed", "note": "found it"}`)
		want := map[string]any{"principal": "local", "key": "lost-1", "tool": "charge", "callId": "call_local_lost-1",
			"outcome": "completed", "previousState": "unknown", "state": "completed"}
		if status != http.StatusOK || fmt.Sprint(m) != fmt.Sprint(want) {
			t.Errorf("resolve completed: %d %v, want %v", status, m, want)
		}
		if s, res := callStateOf(t, db, "local", "lost-1"); s != "completed" || !strings.Contains(res, `"[resolved by an operator] found it"`) {
			t.Errorf("lost-1: %s %s", s, res)
		}
		status, m = f.do(t, http.MethodPost, "/admin/calls/resolve", `{"principal": "user:alice", "key": "lost-1", "outcome": "rerun"}`)
		if status != http.StatusOK || m["state"] != "not_found" || m["previousState"] != "unknown" {
			t.Errorf("resolve rerun: %d %v", status, m)
		}
		if s, _ := callStateOf(t, db, "user:alice", "lost-1"); s != "" {
			t.Errorf("alice's lost-1 resolved as rerun is still there: %s", s)
		}
		status, m = f.do(t, http.MethodPost, "/admin/calls/resolve", `{"key": "lost-1", "outcome": "failed"}`)
		wantError(t, "resolving twice", status, m, http.StatusConflict, "is completed")
		if status, m := f.do(t, http.MethodGet, "/admin/calls/unknown", ""); status != http.StatusOK || !slices.Equal(keys(m), []string{"local/lost-2"}) {
			t.Errorf("unknown calls left: %d %v", status, m)
		}
		// By call id: the answer names the call as the other form does.
		status, m = f.do(t, http.MethodPost, "/admin/calls/resolve", `{"callId": "call_local_lost-2", "outcome": "failed"}`)
		if status != http.StatusOK || m["principal"] != "local" || m["key"] != "lost-2" || m["state"] != "failed" {
			t.Errorf("resolve by callId: %d %v", status, m)
		}
		if s, _ := callStateOf(t, db, "local", "lost-2"); s != "failed" {
			t.Errorf("lost-2 resolved by callId: %s", s)
		}
	})
}

// TestAdminForgetPrincipal: POST /admin/principals/forget erases the
// principal's results and cancels its undelivered effects; others are
// untouched; an empty principal is refused, and one never seen answers 404.
func TestAdminForgetPrincipal(t *testing.T) {
	t.Parallel()
	path, db := newEffectsDB(t, 2) // calls operate-1 and operate-2 of local, each with a pending effect
	f := newAdminFixture(t, path)
	status, m := f.do(t, http.MethodPost, "/admin/principals/forget", `{}`)
	wantError(t, "forget without a principal", status, m, http.StatusBadRequest, "give the principal")
	status, m = f.do(t, http.MethodPost, "/admin/principals/forget", `{"principal": "alice"}`)
	wantError(t, "forget a principal never seen", status, m, http.StatusNotFound, "principal user:alice is unknown")
	if m["principal"] != "user:alice" || m["unknown"] != true || m["calls"] != 0.0 {
		t.Errorf("forget alice: %v, want the answer's fields beside the error", m)
	}
	status, m = f.do(t, http.MethodPost, "/admin/principals/forget", `{"principal": "local"}`)
	if status != http.StatusOK || m["calls"] != 2.0 || m["effects"] != 2.0 {
		t.Errorf("forget local: %d %v, want 2 calls and 2 effects", status, m)
	}
	if n := countRows(t, db, `SELECT count(*) FROM calls WHERE result IS NULL AND erased_at IS NOT NULL`); n != 2 {
		t.Errorf("%d calls erased, want 2", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM effects WHERE state = 'cancelled' AND body IS NULL`); n != 2 {
		t.Errorf("%d effects cancelled and emptied, want 2", n)
	}
}
