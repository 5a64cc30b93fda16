// Package guesslimit limits failed authentications per client address:
// wrong admin tokens (the operator surface and its page's login), wrong
// bearer tokens and refused OAuth tokens on /mcp. Past the limit a client
// is answered 429 until its window ends, its token not looked at, so a
// guesser costs no signature check; and it is logged at a rate a log can
// hold.
//
// Except a token accepted recently (Accepted: within KnownFor of its last
// success, and not past its own expiry): past the limit it is still
// looked at, and verified as usual. A client address is the TCP peer, so
// behind a reverse proxy, a mesh's sidecar or a load balancer every client
// shares one; without this rule anyone could lock every user out by
// sending wrong tokens through it. A guesser never had a success, so it
// gains nothing; a client that authenticated before the guessing began
// keeps working. A client whose first token comes while its address is
// over the limit still gets 429 until the window ends: telling it apart
// from a guesser would take the verification the limit exists to spare.
// What is remembered is the SHA-256 of each accepted token, never the
// token, at most maxKnown of them; looking a token up costs one SHA-256,
// and only for a token no longer than the longest accepted.
//
// The counts are kept in this process's memory, not shared through the
// database, on purpose. With n replicas behind a balancer a guesser gets n
// times the attempts, but a token of `mcp-outbox token new` is a random
// 256-bit secret: no rate of guessing finds it, so the limit's work is to
// keep a guesser from filling the log and burning CPU, which a limit per
// process does on each process. Sharing it would cost a database write per
// failure, made by unauthenticated clients: on SQLite, whose one writer
// also commits the tool calls, that would turn a guesser into a brake on
// the server.
package guesslimit

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

const (
	// Window is how long a client's failures count: the first failure
	// opens a window, Max failures in it close the surface to the client
	// until it ends.
	Window = time.Minute
	// MaxTokenFailures is the limit for /mcp's bearer and OAuth tokens.
	// A real client fails a few times at most (an expired OAuth token is
	// refused once, then refreshed; a wrong static token is a
	// configuration mistake that retrying does not fix), so 20 a minute is
	// never reached by one, and 28,800 guesses a day are nothing against
	// a 256-bit token.
	MaxTokenFailures = 20
	// maxClients bounds the clients tracked; when full, ended windows go
	// first, then the oldest.
	maxClients = 1000
	// KnownFor is how long a token stays known after its last success
	// (Accepted), unless it expires first: an hour outlives the pauses of
	// a client at work, and bounds how long a token revoked at its issuer
	// but not yet refused here is verified past the limit.
	KnownFor = time.Hour
	// maxKnown bounds the tokens remembered (32 bytes and a time each);
	// when full, expired entries go first, then the one nearest its end.
	maxKnown = 4096
	// SummaryEvery is the period of the summary log line.
	SummaryEvery = time.Minute
	// maxLimitWarnings bounds the lines that name a client reaching the
	// limit, per period: from many addresses the rest are counted in the
	// summary only.
	maxLimitWarnings = 3
)

// Options configure [New].
type Options struct {
	// Surface names what is guessed at in the log lines: "operator",
	// "mcp bearer", "mcp oauth".
	Surface string
	// Max failures per client in a Window; required.
	Max int
	// Logger gets the lines; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Limiter counts failed authentications per client in fixed windows. A
// success neither counts nor resets the count. Its log is, per period of
// SummaryEvery: a warning for each of the first few clients that reach
// the limit, and one summary of the failures and the refusals, written
// when the period ends; so a client guessing thousands of times a second
// makes two lines a minute. Each failure is not logged.
type Limiter struct {
	surface string
	max     int
	logger  *slog.Logger
	now     func() time.Time

	mu       sync.Mutex
	byClient map[string]failures
	// known holds the SHA-256 of each token accepted recently and when it
	// stops being known; longest is the length of the longest token ever
	// accepted, so that a longer one, known to be unknown, is not hashed.
	known   map[[sha256.Size]byte]time.Time
	longest int
	// The current period of the summary: zero when nothing happened since
	// the last one.
	period                   time.Time
	gen                      int // the period's number, for its timer
	failed, refused, limited int
	letThrough               int // known tokens looked at past the limit
	warned                   int
}

type failures struct {
	since time.Time // the first failure of the window
	n     int
}

// New returns a limiter.
func New(o Options) *Limiter {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Limiter{surface: o.Surface, max: o.Max, logger: o.Logger, now: o.Now,
		byClient: map[string]failures{}, known: map[[sha256.Size]byte]time.Time{}}
}

// Blocked says how long client must wait before token, the credential
// its request carries ("" for none), is looked at; zero when it may be
// looked at now: the client is under the limit, or token is known
// (Accepted). A refusal, and a known token let through past the limit,
// are counted for the summary.
func (l *Limiter) Blocked(client, token string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.byClient[client]
	if !ok {
		return 0
	}
	now := l.now()
	end := f.since.Add(Window)
	if !end.After(now) {
		delete(l.byClient, client)
		return 0
	}
	if f.n < l.max {
		return 0
	}
	l.noteLocked(now)
	if l.knownLocked(token, now) {
		l.letThrough++
		return 0
	}
	l.refused++
	return end.Sub(now)
}

// Accepted records that token was accepted (verified, not merely
// admitted): it stays known for KnownFor from now, or until expiry if
// that is sooner (the zero time: no expiry of its own).
func (l *Limiter) Accepted(token string, expiry time.Time) {
	if token == "" {
		return
	}
	sum := sha256.Sum256([]byte(token))
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	until := now.Add(KnownFor)
	if !expiry.IsZero() && expiry.Before(until) {
		until = expiry
	}
	if !until.After(now) {
		delete(l.known, sum)
		return
	}
	if _, ok := l.known[sum]; !ok && len(l.known) >= maxKnown {
		l.evictKnownLocked(now)
	}
	l.known[sum] = until
	l.longest = max(l.longest, len(token))
}

// knownLocked reports whether token is known and not expired.
func (l *Limiter) knownLocked(token string, now time.Time) bool {
	if token == "" || len(token) > l.longest {
		return false
	}
	sum := sha256.Sum256([]byte(token))
	until, ok := l.known[sum]
	if ok && !until.After(now) {
		delete(l.known, sum)
		return false
	}
	return ok
}

// evictKnownLocked drops the expired tokens and, if none had expired, the
// one nearest its end: only accepted tokens get in, so the set fills only
// with more clients at work than it holds, and the one dropped is the
// likeliest to be gone already.
func (l *Limiter) evictKnownLocked(now time.Time) {
	var first [sha256.Size]byte
	var firstUntil time.Time
	for sum, until := range l.known {
		if !until.After(now) {
			delete(l.known, sum)
			continue
		}
		if firstUntil.IsZero() || until.Before(firstUntil) {
			first, firstUntil = sum, until
		}
	}
	if len(l.known) >= maxKnown {
		delete(l.known, first)
	}
}

// Fail counts a failed authentication of client with token ("" for none
// to judge), which is no longer known: a token refused now (revoked,
// expired) must not be looked at past the limit any more.
func (l *Limiter) Fail(client, token string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if token != "" && len(token) <= l.longest {
		delete(l.known, sha256.Sum256([]byte(token)))
	}
	f, ok := l.byClient[client]
	if !ok || !f.since.Add(Window).After(now) {
		if !ok && len(l.byClient) >= maxClients {
			l.evictLocked(now)
		}
		f = failures{since: now}
	}
	f.n++
	l.byClient[client] = f
	l.noteLocked(now)
	l.failed++
	if f.n != l.max {
		return
	}
	l.limited++
	if l.warned < maxLimitWarnings {
		l.warned++
		l.logger.Warn("authentication failures over the limit: the client's attempts are refused (429) unchecked until its window ends, but for tokens accepted recently",
			"surface", l.surface, "client", client, "failures", l.max, "window", Window.String())
	}
}

// noteLocked starts a period at the first event after the last summary,
// and ends one whose time has passed on the limiter's clock. Each period
// also has a timer, so that its summary is written when it ends even if
// nothing follows it; with an injected clock the next event writes it.
func (l *Limiter) noteLocked(now time.Time) {
	if !l.period.IsZero() && now.Sub(l.period) >= SummaryEvery {
		l.summarizeLocked(now)
	}
	if l.period.IsZero() {
		l.period = now
		l.gen++
		gen := l.gen
		time.AfterFunc(SummaryEvery, func() { l.flush(gen) })
	}
}

// flush writes the summary of period gen, unless it was written already.
func (l *Limiter) flush(gen int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen == l.gen && !l.period.IsZero() {
		l.summarizeLocked(l.now())
	}
}

func (l *Limiter) summarizeLocked(now time.Time) {
	if l.failed+l.refused+l.letThrough > 0 {
		l.logger.Warn("failed authentications",
			"surface", l.surface, "failures", l.failed, "refused_unchecked", l.refused,
			"known_let_through", l.letThrough, "clients_over_limit", l.limited,
			"since", l.period.UTC().Format(time.RFC3339), "seconds", int(now.Sub(l.period).Seconds()))
	}
	l.period = time.Time{}
	l.failed, l.refused, l.limited, l.letThrough, l.warned = 0, 0, 0, 0, 0
}

// evictLocked drops the ended windows and, if none had ended, the oldest
// one: a client that floods the table from many addresses gains the
// attempts it could make from them anyway.
func (l *Limiter) evictLocked(now time.Time) {
	var oldest string
	var oldestSince time.Time
	for c, f := range l.byClient {
		if !f.since.Add(Window).After(now) {
			delete(l.byClient, c)
			continue
		}
		if oldestSince.IsZero() || f.since.Before(oldestSince) {
			oldest, oldestSince = c, f.since
		}
	}
	if len(l.byClient) >= maxClients {
		delete(l.byClient, oldest)
	}
}

// Seconds is wait in whole seconds, rounded up: a Retry-After.
func Seconds(wait time.Duration) int { return int((wait + time.Second - 1) / time.Second) }

// Refuse answers 429 with Retry-After and a plain-text body that says
// why, for the surfaces that answer in plain text.
func Refuse(w http.ResponseWriter, wait time.Duration) {
	secs := Seconds(wait)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, Message(secs), http.StatusTooManyRequests)
}

// Message is the refusal's text.
func Message(secs int) string {
	return fmt.Sprintf("too many failed authentications from this address: wait %d seconds, then try again", secs)
}
