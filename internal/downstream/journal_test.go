package downstream_test

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
)

// A server started again on the journal and address of one that is gone
// still knows the keys the first applied: a retry is replayed with the
// first response, byte for byte, and nothing is applied twice.
func TestJournalOutlivesTheServer(t *testing.T) {
	t.Parallel()
	journal := filepath.Join(t.TempDir(), "applied.jsonl")
	c := newClient(t)

	first, err := downstream.New(&downstream.Options{Journal: journal})
	if err != nil {
		t.Fatal(err)
	}
	u := first.URL() + "/v1/charges"
	r1 := mustSend(t, c, http.MethodPost, u, key("k1"), `{"amount":1}`)
	wantStatus(t, r1, http.StatusOK)
	mustSend(t, c, http.MethodPost, u, nil, "no key")
	addr := strings.TrimPrefix(first.URL(), "http://")
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	again, err := downstream.New(&downstream.Options{Journal: journal, Addr: addr})
	if err != nil {
		t.Fatalf("start again on %s: %v", addr, err)
	}
	t.Cleanup(func() { again.Close() })
	if again.URL() != first.URL() {
		t.Errorf("URL %s, want the first server's %s", again.URL(), first.URL())
	}
	replay := mustSend(t, c, http.MethodPost, u, key("k1"), `{"amount":1}`)
	if replay.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(replay.body, r1.body) {
		t.Errorf("retry after the restart: %d %s, want the replay of %s", replay.status, replay.body, r1.body)
	}
	if r := mustSend(t, c, http.MethodPost, u, key("k1"), `{"amount":2}`); r.status != http.StatusUnprocessableEntity {
		t.Errorf("key reused with another body after the restart: status %d, want 422", r.status)
	}
	r3 := mustSend(t, c, http.MethodPost, u, key("k2"), `{"amount":3}`)
	if id := chargeID(t, r3.body); id != "ch_3" {
		t.Errorf("new effect after the restart has id %s, want ch_3 (ids go on)", id)
	}
	applied := wantApplied(t, again, 3)
	for i, want := range []struct{ id, key, body string }{{"ch_1", "k1", `{"amount":1}`}, {"ch_2", "", "no key"}, {"ch_3", "k2", `{"amount":3}`}} {
		if e := applied[i]; e.ID != want.id || e.Key != want.key || string(e.Body) != want.body {
			t.Errorf("applied[%d] = %+v, want %s under key %q with body %s", i, e, want.id, want.key, want.body)
		}
	}
	if n := len(again.Requests()); n != 3 {
		t.Errorf("%d requests recorded after the restart, want 3 (requests are not journaled)", n)
	}
}

// A journal whose last line was cut short (the process died while writing
// it) loads without that line, which was never answered.
func TestJournalDropsACutLine(t *testing.T) {
	t.Parallel()
	journal := filepath.Join(t.TempDir(), "applied.jsonl")
	line := `{"id":"ch_1","key":"k1","method":"POST","path":"/v1/charges","body":"e30="}` + "\n"
	if err := os.WriteFile(journal, []byte(line+`{"id":"ch_2","key":"k2","meth`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := downstream.Start(t, &downstream.Options{Journal: journal})
	c := newClient(t)
	if r := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), "{}"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("k1 from the journal: %d %s, not a replay", r.status, r.body)
	}
	r := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k2"), "{}")
	if r.header.Get("Idempotent-Replayed") != "" || chargeID(t, r.body) != "ch_2" {
		t.Errorf("k2, cut from the journal: %d %s, want executed as ch_2", r.status, r.body)
	}
	b, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"); len(lines) != 2 || lines[0]+"\n" != line {
		t.Errorf("journal after the restart:\n%s\nwant the first line and k2's", b)
	}
}

// FaultFunc picks a fault for requests that no queued fault matched.
func TestFaultFunc(t *testing.T) {
	t.Parallel()
	var asked []string
	s := downstream.Start(t, &downstream.Options{FaultFunc: func(method, path, key string) downstream.Fault {
		asked = append(asked, method+" "+path+" "+key)
		if key == "bad" {
			return downstream.Status(http.StatusServiceUnavailable)
		}
		return downstream.Fault{}
	}})
	s.FailNext(1, downstream.Status(http.StatusTooManyRequests))
	c := newClient(t)
	u := s.URL() + "/v1/charges"
	wantStatus(t, mustSend(t, c, http.MethodPost, u, key("bad"), "{}"), http.StatusTooManyRequests) // the queue first
	wantStatus(t, mustSend(t, c, http.MethodPost, u, key("bad"), "{}"), http.StatusServiceUnavailable)
	wantStatus(t, mustSend(t, c, http.MethodPost, u, key("good"), "{}"), http.StatusOK)
	wantStatus(t, mustSend(t, c, http.MethodGet, s.URL()+"/v1/idempotency/good", nil, ""), http.StatusOK) // lookups are not asked
	if want := []string{"POST /v1/charges bad", "POST /v1/charges good"}; strings.Join(asked, ",") != strings.Join(want, ",") {
		t.Errorf("FaultFunc asked for %q, want %q", asked, want)
	}
	wantOutcomes(t, s, downstream.Faulted, downstream.Faulted, downstream.Executed, downstream.Probed)
}
