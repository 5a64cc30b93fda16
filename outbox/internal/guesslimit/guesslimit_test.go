package guesslimit

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable clock for a Limiter.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time)     { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newClock() *clock               { return &clock{t: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)} }
func lines(b *bytes.Buffer) []string { return strings.Split(strings.TrimSpace(b.String()), "\n") }
func count(ls []string, msg string) (n int) {
	for _, l := range ls {
		if strings.Contains(l, `msg="`+msg) {
			n++
		}
	}
	return n
}

// TestLimiter_Windows: windows end, the table stays bounded, and clients
// are told apart.
func TestLimiter_Windows(t *testing.T) {
	t.Parallel()
	c := newClock()
	now := c.now()
	l := New(Options{Max: 5, Now: c.now})
	for range 4 {
		l.Fail("a", "")
	}
	if w := l.Blocked("a", ""); w != 0 {
		t.Errorf("blocked for %v below the limit", w)
	}
	l.Fail("a", "")
	c.set(now.Add(10 * time.Second))
	if w := l.Blocked("a", ""); w != Window-10*time.Second {
		t.Errorf("blocked for %v, want %v", w, Window-10*time.Second)
	}
	if w := l.Blocked("b", ""); w != 0 {
		t.Errorf("another client blocked for %v", w)
	}
	c.set(now.Add(Window))
	if w := l.Blocked("a", ""); w != 0 || len(l.byClient) != 0 {
		t.Errorf("after the window: blocked %v, %d clients kept", w, len(l.byClient))
	}
	// Full: ended windows go first, then the oldest.
	c.set(now)
	l.Fail("old", "")
	for i := range maxClients - 1 {
		c.set(now.Add(time.Second + time.Duration(i)*time.Millisecond))
		l.Fail(fmt.Sprintf("c%d", i), "")
	}
	c.set(now.Add(2 * time.Second))
	for range 5 {
		l.Fail("c0", "")
	}
	c.set(now.Add(Window)) // "old"'s window has ended
	l.Fail("new-1", "")
	if _, ok := l.byClient["old"]; ok || len(l.byClient) != maxClients {
		t.Errorf("a full table with an ended window: %d clients, old kept %v", len(l.byClient), ok)
	}
	c.set(now.Add(Window + time.Second/2))
	l.Fail("new-2", "")
	if _, ok := l.byClient["c0"]; ok || len(l.byClient) != maxClients {
		t.Errorf("a full table: %d clients, the oldest (c0) kept %v", len(l.byClient), ok)
	}
}

// TestLimiter_Log: a flood of failures and refused attempts, from one
// client and from many, makes a bounded number of lines per period: a
// warning for each of the first clients over the limit and one summary
// with the counts.
func TestLimiter_Log(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	c := newClock()
	l := New(Options{Surface: "test", Max: 5, Now: c.now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	failed, refused := 0, 0
	for i := range 10_000 {
		client := "one"
		if i%50 == 0 {
			client = fmt.Sprintf("many-%d", i) // 200 clients, each at the limit
		}
		if l.Blocked(client, "") > 0 {
			refused++
			continue
		}
		for range map[bool]int{true: 5, false: 1}[client != "one"] {
			l.Fail(client, "")
			failed++
		}
		c.add(5 * time.Millisecond) // under 50 s in all
	}
	ls := lines(&logs)
	if n := count(ls, "authentication failures over the limit"); n != maxLimitWarnings || len(ls) != maxLimitWarnings {
		t.Fatalf("within the period: %d lines, %d warnings of a client over the limit, want %d and %d:\n%s",
			len(ls), n, maxLimitWarnings, maxLimitWarnings, logs.String())
	}
	c.add(SummaryEvery)
	l.Fail("late", "") // ends the period on the injected clock
	ls = lines(&logs)
	if n := count(ls, "failed authentications"); n != 1 || len(ls) != maxLimitWarnings+1 {
		t.Fatalf("after the period: %d lines, %d summaries, want %d and 1:\n%s", len(ls), n, maxLimitWarnings+1, logs.String())
	}
	sum := ls[len(ls)-1]
	for _, want := range []string{"surface=test", fmt.Sprintf("failures=%d ", failed), fmt.Sprintf("refused_unchecked=%d ", refused), "clients_over_limit=201 "} {
		if !strings.Contains(sum, want) {
			t.Errorf("the summary %q lacks %s", sum, want)
		}
	}
	// The period's timer writes a summary no later event would.
	l.flush(l.gen)
	if ls := lines(&logs); len(ls) != maxLimitWarnings+2 || !strings.Contains(ls[len(ls)-1], "failures=1 ") {
		t.Errorf("the last period's summary: %s", logs.String())
	}
	l.flush(l.gen)
	if ls := lines(&logs); len(ls) != maxLimitWarnings+2 {
		t.Errorf("a summary of nothing: %s", logs.String())
	}
}

// TestLimiter_Known: past the limit, a token accepted recently is let
// through (and counted in the summary), an unknown one is refused, even
// one no longer than the longest known; a known token stops being known
// KnownFor after its last success, at its own expiry if sooner, and when
// it fails; the set stays bounded.
func TestLimiter_Known(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	c := newClock()
	start := c.now()
	l := New(Options{Surface: "test", Max: 5, Now: c.now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	l.Accepted("known-token", time.Time{})
	l.Accepted("short-lived", start.Add(10*time.Second))
	l.Accepted("revoked", time.Time{})
	l.Accepted("already-expired", start.Add(-time.Second))
	for range 25 {
		l.Fail("proxy", "guess")
	}
	c.add(time.Second)
	if w := l.Blocked("proxy", "known-token"); w != 0 {
		t.Errorf("a known token past the limit: blocked for %v", w)
	}
	for _, token := range []string{"", "guess", "not-known!", "a-token-longer-than-any-accepted", "already-expired"} {
		if w := l.Blocked("proxy", token); w != Window-time.Second {
			t.Errorf("%q past the limit: blocked for %v, want %v", token, w, Window-time.Second)
		}
	}
	if w := l.Blocked("proxy", "short-lived"); w != 0 {
		t.Errorf("a known token before its expiry: blocked for %v", w)
	}
	l.Fail("proxy", "revoked")
	if w := l.Blocked("proxy", "revoked"); w == 0 {
		t.Error("a known token that then failed is still let through")
	}
	c.add(10 * time.Second)
	if w := l.Blocked("proxy", "short-lived"); w == 0 {
		t.Error("a known token past its own expiry is let through")
	}

	// KnownFor from the last success, across windows.
	c.set(start.Add(KnownFor / 2))
	l.Accepted("known-token", time.Time{})
	c.set(start.Add(KnownFor + time.Minute))
	for range 5 {
		l.Fail("proxy", "guess")
	}
	if w := l.Blocked("proxy", "known-token"); w != 0 {
		t.Errorf("a token accepted %v ago: blocked for %v", KnownFor/2+time.Minute, w)
	}
	c.set(start.Add(KnownFor/2 + KnownFor))
	for range 5 {
		l.Fail("proxy", "guess")
	}
	if w := l.Blocked("proxy", "known-token"); w == 0 {
		t.Errorf("a token accepted %v ago is let through", KnownFor)
	}
	c.add(SummaryEvery)
	l.Fail("late", "") // ends the period on the injected clock
	if ls := lines(&logs); !strings.Contains(ls[len(ls)-1], "known_let_through=0 ") ||
		!strings.Contains(logs.String(), "known_let_through=2 ") || !strings.Contains(logs.String(), "known_let_through=1 ") {
		t.Errorf("the summaries do not count the known tokens let through:\n%s", logs.String())
	}

	// Bounded: expired entries go first, then the one nearest its end.
	c.set(start)
	l = New(Options{Max: 5, Now: c.now})
	l.Accepted("expires-first", start.Add(time.Minute))
	for i := range maxKnown - 1 {
		l.Accepted(fmt.Sprintf("token-%d", i), time.Time{})
	}
	l.Accepted("one-more", time.Time{})
	if len(l.known) != maxKnown {
		t.Errorf("%d tokens known, want %d", len(l.known), maxKnown)
	}
	for range 5 {
		l.Fail("proxy", "guess")
	}
	if l.Blocked("proxy", "expires-first") == 0 || l.Blocked("proxy", "one-more") != 0 || l.Blocked("proxy", "token-0") != 0 {
		t.Error("a full set dropped another token than the one nearest its end")
	}
}
