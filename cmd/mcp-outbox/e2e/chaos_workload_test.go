package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// The soak's workload: logical calls of the ledger's charge tool, each
// retried by its client until it gets its real result.

// chaosCall is one logical call. Its amount is unique in the soak, so
// that a keyless call's arguments identify it (the layer knows its
// retries by their fingerprint) and its charge row can be found.
type chaosCall struct {
	i      int
	key    string // _meta.idempotencyKey; "" for a keyless call
	amount int64  // negative: the charge tool refuses it, and that tool error is its real result
}

func (c chaosCall) fails() bool { return c.amount < 0 }

// params builds the call's request; each attempt needs its own, because
// the SDK writes into the _meta it is given.
func (c chaosCall) params() *mcp.CallToolParams {
	p := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": c.amount, "currency": "usd"}}
	if c.key != "" {
		p.Meta = mcp.Meta{outbox.MetaKeyIdempotency: c.key}
	}
	return p
}

// wantError is the text of the tool error a failing call must get.
func (c chaosCall) wantError() string {
	return fmt.Sprintf("amount must be greater than 0, got %d", c.amount)
}

// chaosPlan draws the logical calls: about half keyed, one in twenty
// failing, amounts unique.
func chaosPlan(n int, seed uint64) []chaosCall {
	rng := rand.New(rand.NewPCG(seed, 0))
	calls := make([]chaosCall, n)
	for i := range calls {
		c := chaosCall{i: i, amount: int64(1000 + i)}
		if rng.Float64() < 0.5 {
			c.key = fmt.Sprintf("chaos-%d-%d", seed, i)
		}
		if rng.Float64() < 0.05 {
			c.amount = -c.amount
		}
		calls[i] = c
	}
	return calls
}

// chaosAnswer is a real result a logical call got.
type chaosAnswer struct {
	chargeID int64  // the charge's id; 0 for a tool error
	errText  string // the tool error's text; "" for a charge
	callID   string // the layer's id of the call, from _meta
	replayed bool
	via      string // the client's name
}

func (a chaosAnswer) String() string {
	what := fmt.Sprintf("charge %d", a.chargeID)
	if a.chargeID == 0 {
		what = fmt.Sprintf("tool error %q", a.errText)
	}
	return fmt.Sprintf("%s (call %s, replayed %v, via %s)", what, a.callID, a.replayed, a.via)
}

// sameResult says whether two answers carry the same result.
func (a chaosAnswer) sameResult(b chaosAnswer) bool {
	return a.chargeID == b.chargeID && a.errText == b.errText && a.callID == b.callID
}

// chaosStats counts what happened to the attempts.
type chaosStats struct {
	attempts, retries, reasks atomic.Int64
	switched, hedged          atomic.Int64 // retries through another client; calls sent through two at once
	timeouts, longTimeouts    atomic.Int64 // attempts cut by the client's timeout (long: the generous one)
	connErrors                atomic.Int64 // the server died, or could not be reached
	inProgress, notRecorded   atomic.Int64 // the layer's transient errors
	firstReplayed             atomic.Int64 // logical calls whose first real answer was a replay
	unanswered                atomic.Int64 // logical calls without a real result by their deadline
	unexpectedN               atomic.Int64 // wrong answers

	// abort ends the soak once maxWrong answers were wrong: a bug is
	// found, and retrying every call until its deadline would only take
	// long to say so.
	abort    func()
	maxWrong int64

	mu         sync.Mutex
	errKinds   map[string]int // connErrors by kind
	unexpected []string       // the first few wrong answers
	wrongCalls map[int]bool   // the logical calls that got one
}

func newChaosStats(abort func(), maxWrong int64) *chaosStats {
	return &chaosStats{errKinds: map[string]int{}, wrongCalls: map[int]bool{}, abort: abort, maxWrong: maxWrong}
}

// chaosErrKind sums up a transport error without its variable parts (ports,
// ids), so that the report can count them by kind.
func chaosErrKind(err error) string {
	s := err.Error()
	for _, cut := range []string{"127.0.0.1:", "pid ", "session "} {
		if i := strings.Index(s, cut); i >= 0 {
			s = s[:i] + cut + "…"
		}
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

func (s *chaosStats) countErr(err error) {
	s.connErrors.Add(1)
	s.mu.Lock()
	s.errKinds[chaosErrKind(err)]++
	s.mu.Unlock()
}

func (s *chaosStats) wrong(c chaosCall, via, msg string) {
	if s.unexpectedN.Add(1) == s.maxWrong {
		s.abort()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wrongCalls[c.i] = true
	if len(s.unexpected) < 20 {
		s.unexpected = append(s.unexpected, fmt.Sprintf("call %d (key %q, amount %d) via %s: %s", c.i, c.key, c.amount, via, msg))
	}
}

// errKindsReport lists the transport errors by kind, most frequent first.
func (s *chaosStats) errKindsReport() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make([]string, 0, len(s.errKinds))
	for k := range s.errKinds {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return s.errKinds[kinds[i]] > s.errKinds[kinds[j]] })
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, "\n    %6d  %s", s.errKinds[k], k)
	}
	return b.String()
}

// chaosVerdict is what an answer means to the client.
type chaosVerdict int

const (
	chaosTransient chaosVerdict = iota // retry: the layer's in_progress
	// retry after a pause: the layer's not_recorded, its store failed
	// (PostgreSQL down) and nothing ran
	chaosNotRecorded
	chaosReal  // the call's outcome
	chaosWrong // must not happen: a bug
)

// chaosClassify reads an answer to c.
func chaosClassify(c chaosCall, res *mcp.CallToolResult, stats *chaosStats) (chaosAnswer, chaosVerdict, string) {
	var a chaosAnswer
	meta, _ := res.Meta[outbox.MetaKeyCall].(map[string]any)
	if meta != nil {
		a.callID, _ = meta["callId"].(string)
		a.replayed, _ = meta["replayed"].(bool)
	}
	if !res.IsError {
		m, _ := res.StructuredContent.(map[string]any)
		id, _ := m["charge_id"].(float64)
		amount, _ := m["amount"].(float64)
		a.chargeID = int64(id)
		switch {
		case c.fails():
			return a, chaosWrong, fmt.Sprintf("charged %v, want the tool error %q", m, c.wantError())
		case a.chargeID <= 0 || int64(amount) != c.amount:
			return a, chaosWrong, fmt.Sprintf("result %v does not name a charge of %d", m, c.amount)
		case meta == nil || meta["state"] != "completed" || a.callID == "":
			return a, chaosWrong, fmt.Sprintf("result carries no completed call record in _meta: %v", res.Meta)
		}
		return a, chaosReal, ""
	}
	text := resultText(res)
	if code, ok := res.Meta[outbox.MetaKeyError].(string); ok {
		switch code {
		case "in_progress":
			stats.inProgress.Add(1)
			return a, chaosTransient, ""
		case "not_recorded":
			stats.notRecorded.Add(1)
			return a, chaosNotRecorded, ""
		}
		return a, chaosWrong, fmt.Sprintf("layer error %s: %s", code, text)
	}
	if len(res.Content) > 0 {
		if tc, ok := res.Content[0].(*mcp.TextContent); ok {
			a.errText = tc.Text // a replay adds its note as further content
		}
	}
	switch {
	case !c.fails():
		return a, chaosWrong, fmt.Sprintf("tool error %q", text)
	case a.errText != c.wantError():
		return a, chaosWrong, fmt.Sprintf("tool error %q, want %q", text, c.wantError())
	case meta == nil || meta["state"] != "failed" || a.callID == "":
		return a, chaosWrong, fmt.Sprintf("tool error carries no failed call record in _meta: %v", res.Meta)
	}
	return a, chaosReal, ""
}

// chaosTiming is the clients' side of the chaos.
type chaosTiming struct {
	shortTimeoutP   float64       // share of attempts with a short timeout
	shortTimeoutMax time.Duration // a short timeout is uniform in [1ms, this]
	longTimeout     time.Duration // every other attempt's
	perCall         time.Duration // a logical call without its real result by then is lost
	reaskP          float64       // share of answered calls asked again, through a random client
	// switchP is the share of retries sent through a random client rather
	// than the call's own, as a client that fails over to another
	// connection or replica does: the retry may reach another process
	// while the first attempt still runs there, or after it was killed.
	switchP float64
	// hedgeP is the share of logical calls sent through two clients at
	// once: two attempts of one call race for its claim.
	hedgeP float64
}

// runChaosCall makes the logical call c through client until it gets its
// real result, or a wrong answer (a bug: retrying would not make it right),
// or its deadline or ctx ends. It reports whether it got the real result.
func runChaosCall(ctx context.Context, own chaosClient, all []chaosClient, c chaosCall, rng *rand.Rand, tm chaosTiming, stats *chaosStats) (chaosAnswer, bool) {
	deadline := time.Now().Add(tm.perCall)
	backoff := 5 * time.Millisecond
	// The client's retry policy when the server is down or cannot record
	// the call: back off a little, so as not to spin.
	backOff := func() {
		t := time.NewTimer(time.Duration(rng.Int64N(int64(backoff))) + time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, 200*time.Millisecond)
	}
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return chaosAnswer{}, false
		}
		client := own
		if attempt > 0 {
			stats.retries.Add(1)
			if rng.Float64() < tm.switchP {
				client = all[rng.IntN(len(all))]
				stats.switched.Add(1)
			}
		}
		stats.attempts.Add(1)
		timeout, long := tm.longTimeout, true
		if rng.Float64() < tm.shortTimeoutP {
			timeout, long = time.Millisecond+time.Duration(rng.Int64N(int64(tm.shortTimeoutMax))), false
		}
		actx, cancel := context.WithTimeout(ctx, timeout)
		res, err := client.call(actx, c.params())
		timedOut := errors.Is(actx.Err(), context.DeadlineExceeded)
		cancel()
		switch {
		case err != nil && errors.Is(err, errChaosClosed):
			return chaosAnswer{}, false
		case err != nil && timedOut:
			stats.timeouts.Add(1)
			if long {
				stats.longTimeouts.Add(1)
			}
			continue
		case err != nil:
			if ctx.Err() != nil {
				return chaosAnswer{}, false
			}
			stats.countErr(err)
			backOff()
			continue
		}
		a, v, msg := chaosClassify(c, res, stats)
		a.via = client.name()
		if v == chaosNotRecorded {
			backOff()
			continue
		}
		backoff = 5 * time.Millisecond
		switch v {
		case chaosReal:
			return a, true
		case chaosWrong:
			stats.wrong(c, client.name(), msg)
			return a, false
		}
	}
}

// chaosWorker makes logical calls from jobs through its client (some
// through two clients at once), and asks some of them again through
// another client, as an agent framework that re-runs a step does: the
// answer must be the same, replayed.
func chaosWorker(ctx context.Context, client chaosClient, all []chaosClient, jobs <-chan chaosCall,
	answers [][]chaosAnswer, rng *rand.Rand, tm chaosTiming, stats *chaosStats) {
	for c := range jobs {
		var got []chaosAnswer
		if rng.Float64() < tm.hedgeP {
			stats.hedged.Add(1)
			other := all[rng.IntN(len(all))]
			hedgeRNG := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())) // a Rand is not for two goroutines
			var b chaosAnswer
			var okB bool
			done := make(chan struct{})
			go func() {
				defer close(done)
				b, okB = runChaosCall(ctx, other, all, c, hedgeRNG, tm, stats)
			}()
			a, okA := runChaosCall(ctx, client, all, c, rng, tm, stats)
			<-done
			got = appendIf(ctx, appendIf(ctx, got, a, okA, stats), b, okB, stats)
		} else {
			a, ok := runChaosCall(ctx, client, all, c, rng, tm, stats)
			got = appendIf(ctx, got, a, ok, stats)
		}
		if len(got) == 0 {
			continue
		}
		if !slices.ContainsFunc(got, func(a chaosAnswer) bool { return !a.replayed }) {
			stats.firstReplayed.Add(1)
		}
		if rng.Float64() < tm.reaskP {
			stats.reasks.Add(1)
			other := all[rng.IntN(len(all))]
			b, ok := runChaosCall(ctx, other, all, c, rng, tm, stats)
			got = appendIf(ctx, got, b, ok, stats)
		}
		answers[c.i] = got
	}
}

// appendIf appends a real result; a call that got none is counted.
func appendIf(ctx context.Context, got []chaosAnswer, a chaosAnswer, ok bool, stats *chaosStats) []chaosAnswer {
	if ok {
		return append(got, a)
	}
	if ctx.Err() == nil {
		stats.unanswered.Add(1)
	}
	return got
}
