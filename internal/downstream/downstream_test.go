package downstream_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
)

type result struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// newClient returns a client that opens a connection per request: on a
// reused connection that breaks, net/http resends a keyed request by itself,
// and the counts these tests check would depend on connection reuse.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func key(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }

// send does not fail the test, so goroutines can call it.
func send(ctx context.Context, c *http.Client, method, url string, h http.Header, body string) result {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

func mustSend(t *testing.T, c *http.Client, method, url string, h http.Header, body string) result {
	t.Helper()
	r := send(t.Context(), c, method, url, h, body)
	if r.err != nil {
		t.Fatalf("%s %s: %v", method, url, r.err)
	}
	return r
}

func wantStatus(t *testing.T, r result, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
}

// chargeID returns the id of a normal response.
func chargeID(t *testing.T, body []byte) string {
	t.Helper()
	var v struct{ ID string }
	if err := json.Unmarshal(body, &v); err != nil || v.ID == "" {
		t.Fatalf("body %s: no id (%v)", body, err)
	}
	return v.ID
}

type apiError struct {
	Error struct {
		Type           string
		Message        string
		IdempotencyKey string `json:"idempotency_key"`
	}
}

func decodeError(t *testing.T, body []byte) apiError {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Type == "" {
		t.Fatalf("body %s: not a JSON error (%v)", body, err)
	}
	return e
}

func outcomes(s *downstream.Server) []downstream.Outcome {
	var out []downstream.Outcome
	for _, r := range s.Requests() {
		out = append(out, r.Outcome)
	}
	return out
}

func wantOutcomes(t *testing.T, s *downstream.Server, want ...downstream.Outcome) {
	t.Helper()
	if got := outcomes(s); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
}

func wantApplied(t *testing.T, s *downstream.Server, n int) []downstream.Effect {
	t.Helper()
	applied := s.Applied()
	if len(applied) != n {
		t.Fatalf("%d effects applied, want %d: %+v", len(applied), n, applied)
	}
	return applied
}

func TestRecordsAndExecutesRequestsWithoutKey(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	before := time.Now()
	h := http.Header{"X-Test": {"yes"}}
	r1 := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges?expand=a", h, `{ "amount": 100 }`)
	r2 := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", nil, "plain text")
	r3 := mustSend(t, c, http.MethodDelete, s.URL()+"/v1/charges/ch_1", nil, "")
	after := time.Now()

	for i, tc := range []struct {
		r    result
		want string
	}{
		{r1, `{"id":"ch_1","object":"charge","path":"/v1/charges?expand=a","received":{"amount":100}}`},
		{r2, `{"id":"ch_2","object":"charge","path":"/v1/charges","received":"plain text"}`},
		{r3, `{"id":"ch_3","object":"charge","path":"/v1/charges/ch_1","received":null}`},
	} {
		wantStatus(t, tc.r, http.StatusOK)
		if string(tc.r.body) != tc.want {
			t.Errorf("response %d: %s, want %s", i+1, tc.r.body, tc.want)
		}
		if ct := tc.r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("response %d: Content-Type %q", i+1, ct)
		}
		if v := tc.r.header.Get("Idempotent-Replayed"); v != "" {
			t.Errorf("response %d: Idempotent-Replayed %q on an executed request", i+1, v)
		}
	}

	reqs := s.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests recorded, want 3", len(reqs))
	}
	first := reqs[0]
	if first.Seq != 1 || first.Method != http.MethodPost || first.Path != "/v1/charges?expand=a" ||
		string(first.Body) != `{ "amount": 100 }` || first.Header.Get("X-Test") != "yes" ||
		first.Key != "" || first.Fault != "" || first.Outcome != downstream.Executed || first.Status != http.StatusOK {
		t.Errorf("first request recorded as %+v", first)
	}
	if first.Time.Before(before) || first.Time.After(after) || reqs[1].Time.Before(first.Time) {
		t.Errorf("request times %v, %v not within [%v, %v] in order", first.Time, reqs[1].Time, before, after)
	}
	if reqs[2].Method != http.MethodDelete || reqs[2].Seq != 3 {
		t.Errorf("third request recorded as %+v", reqs[2])
	}

	applied := wantApplied(t, s, 3)
	if e := applied[0]; e.ID != "ch_1" || e.Seq != 1 || e.Key != "" || e.Method != http.MethodPost ||
		e.Path != "/v1/charges?expand=a" || string(e.Body) != `{ "amount": 100 }` {
		t.Errorf("first effect %+v", e)
	}
	if len(s.Keys()) != 0 {
		t.Errorf("Keys() = %q, want none", s.Keys())
	}

	// Requests and Applied hand out copies.
	reqs[0].Header.Set("X-Test", "changed")
	reqs[0].Body[0] = 'X'
	applied[0].Body[0] = 'X'
	if got := s.Requests()[0]; got.Header.Get("X-Test") != "yes" || got.Body[0] != '{' {
		t.Errorf("changing a returned Request changed the record: %+v", got)
	}
	if got := s.Applied()[0]; got.Body[0] != '{' {
		t.Errorf("changing a returned Effect changed the record: %+v", got)
	}
}

func TestReplaysTheFirstResponse(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)
	u := s.URL() + "/v1/charges"

	first := mustSend(t, c, http.MethodPost, u, key("k1"), `{"amount":100}`)
	wantStatus(t, first, http.StatusOK)
	if v := first.header.Get("Idempotent-Replayed"); v != "" {
		t.Errorf("first response: Idempotent-Replayed %q", v)
	}
	other := mustSend(t, c, http.MethodPost, u, key("k2"), `{"amount":100}`)
	for i := range 2 {
		again := mustSend(t, c, http.MethodPost, u, key("k1"), `{"amount":100}`)
		if again.status != first.status || !bytes.Equal(again.body, first.body) {
			t.Errorf("retry %d: %d %s, want the first response %d %s", i+1, again.status, again.body, first.status, first.body)
		}
		if v := again.header.Get("Idempotent-Replayed"); v != "true" {
			t.Errorf("retry %d: Idempotent-Replayed %q, want true", i+1, v)
		}
	}

	if chargeID(t, first.body) != "ch_1" || chargeID(t, other.body) != "ch_2" {
		t.Errorf("ids %s and %s, want ch_1 and ch_2", first.body, other.body)
	}
	wantApplied(t, s, 2)
	wantOutcomes(t, s, downstream.Executed, downstream.Executed, downstream.Replayed, downstream.Replayed)
	if got := s.Keys(); !slices.Equal(got, []string{"k1", "k2"}) {
		t.Errorf("Keys() = %q", got)
	}
	if s.Count("k1") != 3 || s.Count("k2") != 1 || s.Count("k3") != 0 {
		t.Errorf("Count k1, k2, k3 = %d, %d, %d; want 3, 1, 0", s.Count("k1"), s.Count("k2"), s.Count("k3"))
	}
}

func TestQuotedKeyIsTheBareKey(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)
	u := s.URL() + "/v1/charges"

	first := mustSend(t, c, http.MethodPost, u, key(`"abc"`), "{}")
	wantStatus(t, first, http.StatusOK)
	for _, k := range []string{"abc", ` "abc";v=1 `} {
		r := mustSend(t, c, http.MethodPost, u, key(k), "{}")
		if r.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.body, first.body) {
			t.Errorf("key %s after \"abc\": %d %s, not a replay", k, r.status, r.body)
		}
	}
	escaped := mustSend(t, c, http.MethodPost, u, key(`"a\"b\\c"`), "{}")
	bare := mustSend(t, c, http.MethodPost, u, key(`a"b\c`), "{}")
	if bare.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(bare.body, escaped.body) {
		t.Errorf(`key a"b\c after "a\"b\\c": %d %s, not a replay`, bare.status, bare.body)
	}

	if got := s.Keys(); !slices.Equal(got, []string{"abc", `a"b\c`}) {
		t.Errorf("Keys() = %q", got)
	}
	if n := s.Count("abc"); n != 3 {
		t.Errorf("Count(abc) = %d, want 3", n)
	}
	wantApplied(t, s, 2)
}

func TestInvalidKeyIsRefused(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	for name, h := range map[string]http.Header{
		"too long":        key(strings.Repeat("k", 256)),
		"empty":           key(""),
		"empty quoted":    key(`""`),
		"no closing":      key(`"abc`),
		"bad escape":      key(`"a\qc"`),
		"after the quote": key(`"abc"def`),
		"two lines":       {"Idempotency-Key": {"a", "b"}},
	} {
		r := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", h, "{}")
		if r.status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400; body %s", name, r.status, r.body)
			continue
		}
		if e := decodeError(t, r.body); e.Error.Type != "idempotency_error" {
			t.Errorf("%s: error %+v", name, e)
		}
	}
	for _, r := range s.Requests() {
		if r.Outcome != downstream.Invalid || r.Key != "" || r.Status != http.StatusBadRequest {
			t.Errorf("request %d recorded as %+v", r.Seq, r)
		}
	}
	wantApplied(t, s, 0)

	r := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key(strings.Repeat("k", 255)), "{}")
	wantStatus(t, r, http.StatusOK)
}

func TestKeyReusedForAnotherRequestIs422(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	first := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), `{"amount":100}`)
	wantStatus(t, first, http.StatusOK)
	for name, tc := range map[string]struct{ method, path, body string }{
		"body":         {http.MethodPost, "/v1/charges", `{"amount":200}`},
		"field order":  {http.MethodPost, "/v1/charges", `{"amount": 100}`},
		"method":       {http.MethodPut, "/v1/charges", `{"amount":100}`},
		"path":         {http.MethodPost, "/v1/refunds", `{"amount":100}`},
		"query":        {http.MethodPost, "/v1/charges?x=1", `{"amount":100}`},
		"missing body": {http.MethodPost, "/v1/charges", ""},
	} {
		r := mustSend(t, c, tc.method, s.URL()+tc.path, key("k1"), tc.body)
		if r.status != http.StatusUnprocessableEntity {
			t.Errorf("other %s: status %d, want 422; body %s", name, r.status, r.body)
			continue
		}
		e := decodeError(t, r.body)
		if e.Error.Type != "idempotency_error" || e.Error.IdempotencyKey != "k1" || !strings.Contains(e.Error.Message, `"k1"`) {
			t.Errorf("other %s: error %+v does not name the key", name, e)
		}
	}
	// The refusals change nothing: the first request still replays.
	again := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), `{"amount":100}`)
	if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
		t.Errorf("retry after the refusals: %d %s, not a replay", again.status, again.body)
	}
	wantApplied(t, s, 1)
	if n := s.Count("k1"); n != 8 {
		t.Errorf("Count(k1) = %d, want 8", n)
	}
}

func TestSameKeyWhileFirstInFlightIs409(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)
	u := s.URL() + "/v1/charges"

	release := make(chan struct{})
	s.FailNext(1, downstream.Hold(release))
	firstDone := make(chan result, 1)
	go func() { firstDone <- send(t.Context(), c, http.MethodPost, u, key("k1"), "{}") }()
	if err := s.WaitRequests(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	wantApplied(t, s, 1) // applied before the response, which is held

	second := mustSend(t, c, http.MethodPost, u, key("k1"), "{}")
	wantStatus(t, second, http.StatusConflict)
	if e := decodeError(t, second.body); e.Error.IdempotencyKey != "k1" {
		t.Errorf("409 error %+v does not name the key", e)
	}
	// Another key is not held up.
	wantStatus(t, mustSend(t, c, http.MethodPost, u, key("k2"), "{}"), http.StatusOK)
	if st := s.Requests()[0].Status; st != 0 {
		t.Errorf("held request has status %d before its response", st)
	}

	close(release)
	first := <-firstDone
	if first.err != nil {
		t.Fatal(first.err)
	}
	wantStatus(t, first, http.StatusOK)
	third := mustSend(t, c, http.MethodPost, u, key("k1"), "{}")
	if third.status != first.status || !bytes.Equal(third.body, first.body) || third.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry after the first finished: %d %s, want a replay of %s", third.status, third.body, first.body)
	}

	wantApplied(t, s, 2)
	wantOutcomes(t, s, downstream.Executed, downstream.Conflict, downstream.Executed, downstream.Replayed)
	if got := s.Requests()[0]; got.Fault != "hold" || got.Status != http.StatusOK {
		t.Errorf("held request recorded as %+v", got)
	}
}

func TestConcurrentDuplicatesApplyOnce(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	const n = 16
	start := make(chan struct{})
	results := make(chan result, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			results <- send(t.Context(), c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), `{"amount":1}`)
		})
	}
	close(start)
	wg.Wait()
	close(results)

	var ok [][]byte
	for r := range results {
		switch {
		case r.err != nil:
			t.Fatal(r.err)
		case r.status == http.StatusOK:
			ok = append(ok, r.body)
		case r.status != http.StatusConflict:
			t.Fatalf("status %d, want 200 or 409; body %s", r.status, r.body)
		}
	}
	for _, b := range ok {
		if !bytes.Equal(b, ok[0]) {
			t.Errorf("two successful responses differ: %s and %s", ok[0], b)
		}
	}
	wantApplied(t, s, 1)
	if s.Count("k1") != n {
		t.Errorf("Count(k1) = %d, want %d", s.Count("k1"), n)
	}
}

func TestStatusFaultAppliesNothing(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)
	u := s.URL() + "/v1/charges"

	s.FailNext(2, downstream.Status(http.StatusServiceUnavailable))
	s.FailNext(1, downstream.Status(http.StatusBadRequest))
	for _, want := range []int{503, 503, 400} {
		r := mustSend(t, c, http.MethodPost, u, key("k1"), "{}")
		wantStatus(t, r, want)
		if e := decodeError(t, r.body); !strings.Contains(e.Error.Message, fmt.Sprint(want)) {
			t.Errorf("error %+v does not say the status", e)
		}
	}
	wantApplied(t, s, 0)
	// Nothing was saved for the key, so the retry executes.
	r := mustSend(t, c, http.MethodPost, u, key("k1"), "{}")
	wantStatus(t, r, http.StatusOK)
	if r.header.Get("Idempotent-Replayed") != "" || chargeID(t, r.body) != "ch_1" {
		t.Errorf("retry after the faults: %s, replayed %q; want an execution", r.body, r.header.Get("Idempotent-Replayed"))
	}
	wantApplied(t, s, 1)
	wantOutcomes(t, s, downstream.Faulted, downstream.Faulted, downstream.Faulted, downstream.Executed)
	if got := s.Requests()[0]; got.Fault != "status 503" || got.Status != 503 || got.Key != "k1" {
		t.Errorf("faulted request recorded as %+v", got)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	date := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).Format(http.TimeFormat)
	s.FailNext(1, downstream.RetryAfter(http.StatusTooManyRequests, "2"))
	s.FailNext(1, downstream.RetryAfter(http.StatusServiceUnavailable, date))
	for _, tc := range []struct {
		status int
		value  string
		typ    string
	}{{429, "2", "rate_limit_error"}, {503, date, "api_error"}} {
		r := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), "{}")
		wantStatus(t, r, tc.status)
		if got := r.header.Get("Retry-After"); got != tc.value {
			t.Errorf("Retry-After %q, want %q", got, tc.value)
		}
		if e := decodeError(t, r.body); e.Error.Type != tc.typ {
			t.Errorf("status %d: error type %q, want %q", tc.status, e.Error.Type, tc.typ)
		}
	}
	wantApplied(t, s, 0)
	wantStatus(t, mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), "{}"), http.StatusOK)
}

func TestSlowRespondsLate(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	const d = 30 * time.Millisecond
	s.FailNext(1, downstream.Slow(d))
	start := time.Now()
	r := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), "{}")
	if took := time.Since(start); took < d {
		t.Errorf("slow response took %v, want at least %v", took, d)
	}
	wantStatus(t, r, http.StatusOK)
	wantApplied(t, s, 1)
	if got := s.Requests()[0]; got.Fault != "slow 30ms" || got.Outcome != downstream.Executed || got.Status != http.StatusOK {
		t.Errorf("slow request recorded as %+v", got)
	}
}

// lostResponse sends a keyed request that fault f keeps from being answered,
// gives up on it, and returns the client's error once the server is idle.
func lostResponse(t *testing.T, s *downstream.Server, c *http.Client, f downstream.Fault) error {
	t.Helper()
	s.FailNext(1, f)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan result, 1)
	go func() { done <- send(ctx, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), "{}") }()
	if err := s.WaitRequests(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	r := <-done
	if r.err == nil {
		t.Fatalf("request with %v got %d %s, want no response", f, r.status, r.body)
	}
	if err := s.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	return r.err
}

// wantLostThenReplayed checks that the first, unanswered request applied the
// effect and that a retry gets its response.
func wantLostThenReplayed(t *testing.T, s *downstream.Server, c *http.Client, fault string) {
	t.Helper()
	wantApplied(t, s, 1)
	r := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), "{}")
	wantStatus(t, r, http.StatusOK)
	if r.header.Get("Idempotent-Replayed") != "true" || chargeID(t, r.body) != "ch_1" {
		t.Errorf("retry: %s, replayed %q; want the lost ch_1 replayed", r.body, r.header.Get("Idempotent-Replayed"))
	}
	wantApplied(t, s, 1)
	wantOutcomes(t, s, downstream.Executed, downstream.Replayed)
	if got := s.Requests()[0]; got.Fault != fault || got.Status != 0 {
		t.Errorf("unanswered request recorded as %+v", got)
	}
}

func TestSlowClientLeaves(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)
	lostResponse(t, s, c, downstream.Slow(time.Hour))
	wantLostThenReplayed(t, s, c, "slow 1h0m0s")
}

func TestHangUntilClientLeaves(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)
	if err := lostResponse(t, s, c, downstream.Hang()); !errors.Is(err, context.Canceled) {
		t.Errorf("client error %v, want its own cancellation", err)
	}
	wantLostThenReplayed(t, s, c, "hang")
}

func TestAcceptThenCloseAppliesAndLosesTheResponse(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	s.FailNext(1, downstream.AcceptThenClose())
	r := send(t.Context(), c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), "{}")
	if r.err == nil {
		t.Fatalf("got %d %s, want a client error", r.status, r.body)
	}
	wantLostThenReplayed(t, s, c, "accept-then-close")
}

func TestResetAppliesNothing(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	s.FailNext(1, downstream.Reset())
	r := send(t.Context(), c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), `{"amount":1}`)
	if r.err == nil {
		t.Fatalf("got %d %s, want a client error", r.status, r.body)
	}
	if runtime.GOOS == "linux" && !errors.Is(r.err, syscall.ECONNRESET) {
		t.Errorf("client error %v, want a connection reset", r.err)
	}
	wantApplied(t, s, 0)
	got := s.Requests()[0]
	if got.Outcome != downstream.Faulted || got.Fault != "reset" || got.Status != 0 || string(got.Body) != `{"amount":1}` {
		t.Errorf("reset request recorded as %+v", got)
	}

	retry := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), `{"amount":1}`)
	wantStatus(t, retry, http.StatusOK)
	if retry.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after a reset was replayed: %s", retry.body)
	}
	wantApplied(t, s, 1)
}

func TestKeepAliveClientResendsAfterLostResponse(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	u := s.URL() + "/v1/charges"

	// Opens the connection the next request reuses.
	wantStatus(t, mustSend(t, c, http.MethodPost, u, nil, "{}"), http.StatusOK)
	s.FailNext(1, downstream.AcceptThenClose())
	body := strings.NewReader("{}") // GetBody is set, so the Transport may resend
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	if resp.StatusCode != http.StatusOK || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("got %d, replayed %q; want the Transport's resend replayed", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if n := s.Count("k1"); n != 2 {
		t.Errorf("Count(k1) = %d, want 2: the lost attempt and the Transport's resend", n)
	}
	wantApplied(t, s, 2)
}

func TestLookup(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)
	lookup := func(k string) result {
		t.Helper()
		return mustSend(t, c, http.MethodGet, s.URL()+"/v1/idempotency/"+url.PathEscape(k), nil, "")
	}

	wantStatus(t, lookup("k1"), http.StatusNotFound)
	first := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k1"), "{}")
	weird := mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("a/b c"), "{}")
	s.FailNext(1, downstream.Status(http.StatusInternalServerError))
	wantStatus(t, mustSend(t, c, http.MethodPost, s.URL()+"/v1/charges", key("k3"), "{}"), http.StatusInternalServerError)

	for k, want := range map[string][]byte{"k1": first.body, "a/b c": weird.body} {
		r := lookup(k)
		wantStatus(t, r, http.StatusOK)
		if !bytes.Equal(r.body, want) || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("lookup %q: %s, replayed %q; want %s", k, r.body, r.header.Get("Idempotent-Replayed"), want)
		}
	}
	r := lookup("k3")
	wantStatus(t, r, http.StatusNotFound)
	if e := decodeError(t, r.body); e.Error.IdempotencyKey != "k3" {
		t.Errorf("404 error %+v does not name the key", e)
	}
	// A POST to the lookup path is an effect like any other.
	wantStatus(t, mustSend(t, c, http.MethodPost, s.URL()+"/v1/idempotency/k1", nil, "{}"), http.StatusOK)

	wantApplied(t, s, 3)
	if got := s.Requests()[0]; got.Outcome != downstream.Probed || got.Status != http.StatusNotFound {
		t.Errorf("lookup recorded as %+v", got)
	}
}

func TestNoDedupExecutesEveryRequest(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, &downstream.Options{NoDedup: true})
	c := newClient(t)
	u := s.URL() + "/v1/charges"

	var ids []string
	for _, body := range []string{"{}", "{}", `{"other":1}`} {
		r := mustSend(t, c, http.MethodPost, u, key("k1"), body)
		wantStatus(t, r, http.StatusOK)
		if v := r.header.Get("Idempotent-Replayed"); v != "" {
			t.Errorf("Idempotent-Replayed %q without dedup", v)
		}
		ids = append(ids, chargeID(t, r.body))
	}
	if !slices.Equal(ids, []string{"ch_1", "ch_2", "ch_3"}) {
		t.Errorf("ids %q, want ch_1, ch_2, ch_3", ids)
	}
	wantApplied(t, s, 3)
	wantOutcomes(t, s, downstream.Executed, downstream.Executed, downstream.Executed)

	// The lookup still tells whether the key was applied, with the first response.
	r := mustSend(t, c, http.MethodGet, s.URL()+"/v1/idempotency/k1", nil, "")
	wantStatus(t, r, http.StatusOK)
	if chargeID(t, r.body) != "ch_1" {
		t.Errorf("lookup: %s, want ch_1", r.body)
	}
	wantStatus(t, mustSend(t, c, http.MethodGet, s.URL()+"/v1/idempotency/k2", nil, ""), http.StatusNotFound)
}

func TestFaultsMatchInQueueOrder(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)
	post := func(path, k string) int {
		t.Helper()
		var h http.Header
		if k != "" {
			h = key(k)
		}
		return mustSend(t, c, http.MethodPost, s.URL()+path, h, "{}").status
	}

	s.FailNext(1, downstream.Status(501).ForPath("/v1/refunds"))
	s.FailNext(2, downstream.Status(502).ForKey("k2"))
	s.FailNext(1, downstream.Status(503))
	s.FailNext(1, downstream.Status(504).ForPath("/v1/idempotency/k9"))

	// An unrestricted fault leaves lookups alone; one for the lookup's path does not.
	if got := mustSend(t, c, http.MethodGet, s.URL()+"/v1/idempotency/k1", nil, "").status; got != 404 {
		t.Errorf("lookup: %d, want 404", got)
	}
	if got := mustSend(t, c, http.MethodGet, s.URL()+"/v1/idempotency/k9", nil, "").status; got != 504 {
		t.Errorf("lookup of k9: %d, want 504", got)
	}
	var got []int
	for _, req := range []struct{ path, key string }{
		{"/v1/charges", "k2"},   // 502, matched before the unrestricted 503
		{"/v1/charges", "k1"},   // 503
		{"/v1/charges", "k1"},   // 200: the 503 is used up
		{"/v1/refunds", "k3"},   // 501
		{"/v1/refunds", "k2"},   // 502
		{"/v1/refunds", "k2"},   // 200
		{"/v1/charges?x", ""},   // 200: paths match without query
		{"/v1/refunds?x", "k4"}, // 200
	} {
		got = append(got, post(req.path, req.key))
	}
	if want := []int{502, 503, 200, 501, 502, 200, 200, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}

func TestFailNextRejectsNonsense(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	for name, call := range map[string]func(){
		"n = 0":    func() { s.FailNext(0, downstream.Reset()) },
		"no fault": func() { s.FailNext(1, downstream.Fault{}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: FailNext did not panic", name)
				}
			}()
			call()
		}()
	}
}

func TestWaitRequests(t *testing.T) {
	t.Parallel()
	s := downstream.Start(t, nil)
	c := newClient(t)

	const n = 20
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { send(t.Context(), c, http.MethodPost, s.URL()+"/v1/charges", nil, "{}") })
	}
	if err := s.WaitRequests(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Requests()); got < n {
		t.Errorf("WaitRequests(%d) returned with %d requests", n, got)
	}
	wg.Wait()

	ids := make(map[string]bool)
	for _, e := range wantApplied(t, s, n) {
		ids[e.ID] = true
	}
	if len(ids) != n {
		t.Errorf("%d distinct ids for %d effects", len(ids), n)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.WaitRequests(ctx, n+1); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitRequests with a cancelled context: %v", err)
	}
}

// TestCloseEndsPendingRequests runs alone: it looks for the server's
// goroutines among all of them.
func TestCloseEndsPendingRequests(t *testing.T) {
	s, err := downstream.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t)

	never := make(chan struct{})
	faults := []downstream.Fault{downstream.Hang(), downstream.Slow(time.Hour), downstream.Hold(never)}
	for _, f := range faults {
		s.FailNext(1, f)
	}
	results := make(chan result, len(faults))
	for i := range faults {
		go func() {
			results <- send(t.Context(), c, http.MethodPost, s.URL()+"/v1/charges", key(fmt.Sprint(i)), "{}")
		}()
	}
	if err := s.WaitRequests(t.Context(), len(faults)); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() { waiting <- s.WaitRequests(t.Context(), len(faults)+1) }()

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range faults {
		if r := <-results; r.err == nil {
			t.Errorf("pending request got %d %s after Close, want an error", r.status, r.body)
		}
	}
	if err := <-waiting; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("WaitRequests across Close: %v, want ErrServerClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	wantApplied(t, s, len(faults))

	// A handler signals that it is done from a deferred call, so its
	// goroutine may still be returning when Close does: allow it that
	// moment, not a goroutine that stays.
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "internal/downstream.(*Server)") {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("a server goroutine outlived Close:\n%s", stacks)
			break
		}
		runtime.Gosched()
	}
}
