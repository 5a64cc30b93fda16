// Package inflight bounds the requests an MCP endpoint serves at once, in
// all and per principal: what one token can make a server hold in memory
// is its requests in flight times what each holds (up to the 4 MiB body
// limit, several times over inside go-sdk), so without a bound sixteen
// concurrent 4 MiB calls of one token took 930 MiB (issue 37).
package inflight

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// Limits are the bounds of a [Limiter]; a value of zero or less turns its
// bound off (the caller applies its defaults first).
type Limits struct {
	Total, PerPrincipal int
	// PerPrincipalBytes bounds a principal's request bodies in flight, by
	// their Content-Length (a body without one counts as UnknownLength):
	// what a request holds grows with its body, so many small calls are
	// cheap and a few large ones are not. A principal with nothing in
	// flight is always let in, whatever its body's length.
	PerPrincipalBytes int64
	// UnknownLength is what a body without a Content-Length counts as:
	// the most it may be.
	UnknownLength int64
	// TotalHow, PerPrincipalHow and PerPrincipalBytesHow say, in the
	// refusal, how to change each bound (a flag, an environment variable,
	// a library option).
	TotalHow, PerPrincipalHow, PerPrincipalBytesHow string
}

// Limiter counts the requests in flight.
type Limiter struct {
	lim    Limits
	logger *slog.Logger

	mu    sync.Mutex
	total int
	by    map[string]held
	log   refusalLog
}

// held is what one principal has in flight.
type held struct {
	n     int
	bytes int64
}

// New returns a Limiter; logger gets the refusals, counted.
func New(lim Limits, logger *slog.Logger) *Limiter {
	if logger == nil {
		logger = slog.Default()
	}
	return &Limiter{lim: lim, logger: logger, by: map[string]held{}, log: refusalLog{every: time.Minute}}
}

// RetryAfter is the Retry-After of a refusal, in seconds: a call of the
// layer usually answers within it, and a client that waits less only
// adds load.
const RetryAfter = 1

// Wrap counts every request to h but event streams: a GET that accepts
// text/event-stream is a session's standalone stream, open as long as
// the session (the same test as the shutdown tracker's in mcphttp), and
// counting it would let a client's own stream refuse its calls. A request
// past a bound is refused before its body is read.
//
// The principal is the go-sdk's auth.TokenInfo.UserID that the
// authentication in front (bearer.Verifier.Require, the OAuth resource
// server) put in the request's context. A request without one (no
// authentication configured: a loopback listener, or --insecure-no-auth)
// counts against the total only: its clients cannot be told apart.
func (l *Limiter) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
			h.ServeHTTP(w, r)
			return
		}
		principal := ""
		if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
			principal = ti.UserID
		}
		size := r.ContentLength
		if size < 0 {
			size = l.lim.UnknownLength
		}
		if status, msg := l.acquire(principal, size); status != 0 {
			l.log.refused(l.logger, msg)
			refuse(w, status, msg)
			return
		}
		defer l.release(principal, size)
		h.ServeHTTP(w, r)
	})
}

func (l *Limiter) acquire(principal string, size int64) (status int, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.by[principal]
	if principal != "" && l.lim.PerPrincipal > 0 && h.n >= l.lim.PerPrincipal {
		return http.StatusTooManyRequests, fmt.Sprintf(
			"too many requests in flight for this principal: it has %d running, the limit per principal is %d (%s); "+
				"retry once one of them is answered", h.n, l.lim.PerPrincipal, l.lim.PerPrincipalHow)
	}
	if principal != "" && l.lim.PerPrincipalBytes > 0 && h.n > 0 && h.bytes+size > l.lim.PerPrincipalBytes {
		return http.StatusTooManyRequests, fmt.Sprintf(
			"too many request bytes in flight for this principal: %d running hold %d bytes of body, this one %d more, "+
				"the limit per principal is %d (%s); retry once one of them is answered",
			h.n, h.bytes, size, l.lim.PerPrincipalBytes, l.lim.PerPrincipalBytesHow)
	}
	if l.lim.Total > 0 && l.total >= l.lim.Total {
		return http.StatusServiceUnavailable, fmt.Sprintf(
			"too many requests in flight: the server has %d running, its limit is %d (%s); retry shortly",
			l.total, l.lim.Total, l.lim.TotalHow)
	}
	l.total++
	if principal != "" {
		l.by[principal] = held{h.n + 1, h.bytes + size}
	}
	return 0, ""
}

func (l *Limiter) release(principal string, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if principal == "" {
		return
	}
	h := l.by[principal]
	if h.n <= 1 {
		delete(l.by, principal)
		return
	}
	l.by[principal] = held{h.n - 1, h.bytes - size}
}

// codeLimit is the JSON-RPC error of a refused request: in the
// implementation-defined server error range, as the go-sdk's own
// transport errors are.
const codeLimit = -32000

// refuse answers with the limit's error: the status and Retry-After say
// it to any client, the JSON-RPC error to one that reads the body (the
// TypeScript SDK puts the body in the error it throws). Its id is null:
// the body is not read, which is the point.
func refuse(w http.ResponseWriter, status int, msg string) {
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil,
		"error": map[string]any{"code": codeLimit, "message": msg}})
	w.Header().Set("Retry-After", fmt.Sprint(RetryAfter))
	if err != nil {
		http.Error(w, msg, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// refusalLog logs refusals at a rate a log can hold: the first as it
// happens, then a count of the ones since, with the latest reason, at
// most once per every (a client retrying at once would otherwise make a
// line per attempt). A count pending when the flood stops is logged by a
// timer once every has passed.
type refusalLog struct {
	every   time.Duration
	mu      sync.Mutex
	last    time.Time
	pending int
	reason  string
	timer   *time.Timer
}

func (l *refusalLog) refused(logger *slog.Logger, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending++
	l.reason = reason
	now := time.Now()
	if l.last.IsZero() || now.Sub(l.last) >= l.every {
		l.flushLocked(logger, now)
		return
	}
	if l.timer == nil {
		l.timer = time.AfterFunc(l.every-now.Sub(l.last), func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.timer = nil
			if l.pending > 0 {
				l.flushLocked(logger, time.Now())
			}
		})
	}
}

func (l *refusalLog) flushLocked(logger *slog.Logger, now time.Time) {
	logger.Warn("refuse request in flight", "reason", l.reason, "refused", l.pending, "per", l.every)
	l.last, l.pending = now, 0
}
