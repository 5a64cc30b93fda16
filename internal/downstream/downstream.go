// Package downstream is a fake downstream HTTP API for tests of effect
// delivery. It models Stripe's handling of the Idempotency-Key header and can
// fail chosen requests the way real networks and servers do, so a test can
// check that every effect is applied exactly once however its delivery goes.
//
// # What it models
//
// Every request is recorded, in the order the server finished reading it, with
// what the server did with it ([Server.Requests]). A request that carries an
// Idempotency-Key is deduplicated by that key alone:
//
//   - the first request with a key is executed: the effect is applied
//     ([Server.Applied]) and the response, 200 with a small JSON object, is
//     saved for the key;
//   - a later request with the same key, method, path (with query) and body
//     gets the saved response again, with the header Idempotent-Replayed: true;
//   - one with the same key and another method, path or body gets 422;
//   - one that arrives while the first is still being handled (see [Slow],
//     [Hold], [Hang]) gets 409 and may be retried.
//
// A request without a key is executed every time. The key may be sent bare
// (abc, as Stripe takes it) or as a Structured Field string ("abc", as the
// IETF draft writes it); both name the same key. A key that is empty, longer
// than 255 bytes, badly quoted or sent on two header lines gets 400.
//
// GET /v1/idempotency/{key} answers whether a key was applied: 200 with the
// first response for that key, 404 if no request with it was executed. It
// stands for the lookup a destination without deduplication may offer, and
// works with [Options.NoDedup] too, where the server ignores keys and
// executes every request.
//
// # Where it differs from Stripe
//
//   - Reusing a key with other parameters gets 422, as in the IETF draft
//     (draft-ietf-httpapi-idempotency-key-header); Stripe answers 400 with an
//     idempotency_error.
//   - Parameters are compared as method, path with query and raw body bytes,
//     so the same JSON with its fields reordered is a different request.
//   - Keys are scoped by key only, not by account and mode, and never expire
//     (Stripe keeps them for at least 24 hours).
//   - Stripe saves and replays the result of any request that began
//     execution, 500 errors included. Here an executed request always succeeds;
//     failures come only from injected faults, and [Status], [RetryAfter] and
//     [Reset] act before execution, so nothing is saved and a retry with the
//     same key is executed.
//   - The lookup endpoint is not Stripe's.
//
// # Faults
//
// [Server.FailNext] queues a fault for chosen requests. Whether the effect is
// applied is what delivery tests depend on:
//
//	Status(code)          not applied  code with a JSON error
//	RetryAfter(code, v)   not applied  code with Retry-After: v and a JSON error
//	Reset()               not applied  no response: TCP RST once the request is read
//	AcceptThenClose()     applied*     no response: the connection is closed (FIN)
//	Slow(d)               applied*     the response, d later
//	Hold(release)         applied*     the response, once release is closed
//	Hang()                applied*     no response, until the client gives up
//
// * Applied if the request is executed: it is the first with its key, has no
// key, or [Options.NoDedup] is set. These faults change only how the response
// is delivered, so a request that would be replayed or refused is replayed or
// refused late, or not at all.
//
// The key stays in flight (409 for others) until the response is sent or the
// server sees that the client went away. After a client gives up on a Slow,
// Hold or Hang request, a retry can briefly get 409 before the server notices;
// [Server.WaitIdle] waits that out.
//
// # Go clients resend on their own
//
// net/http's Transport resends a request that carries an Idempotency-Key when
// a reused keep-alive connection breaks before the response (as after Reset or
// AcceptThenClose). Such a resend is a request like any other here, recorded
// and counted; tests that count requests can disable keep-alives.
package downstream

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// Options configures a Server. The zero value, or nil, is a deduplicating
// server.
type Options struct {
	// NoDedup makes the server ignore Idempotency-Key and execute every
	// request, as a destination that cannot deduplicate does. The lookup
	// endpoint still reports the first executed request of each key.
	NoDedup bool

	// Addr is the address to listen on; "" means 127.0.0.1:0, a free
	// port. A server started again on the address of one that was killed
	// is the same API coming back for clients configured with its URL.
	Addr string

	// Journal is a file that records every applied effect, so that a
	// server started on it again (after its process was killed) knows the
	// keys it applied, replays them, and lists their effects in Applied.
	// "" keeps everything in memory. Recorded requests are not kept. See
	// journal.go for what survives what.
	Journal string

	// FaultFunc, if set, chooses a fault for each request that no queued
	// fault (FailNext) matched, lookups excepted; the zero Fault is none.
	// It runs under the server's lock, so it must not call the server's
	// methods; requests reach it one at a time. Restrictions (ForPath,
	// ForKey) on the Fault it returns are ignored.
	FaultFunc func(method, path, key string) Fault
}

// Outcome says what the server did with a request.
type Outcome string

// Outcomes of a request.
const (
	Executed   Outcome = "executed"   // the effect was applied
	Replayed   Outcome = "replayed"   // the key's saved response was sent again
	Conflict   Outcome = "conflict"   // 409: the key's first request was still in flight
	Mismatch   Outcome = "mismatch"   // 422: the key was used with another method, path or body
	Invalid    Outcome = "invalid"    // 400: the Idempotency-Key header is unusable
	Faulted    Outcome = "faulted"    // refused or dropped by Status, RetryAfter or Reset; or 500: the journal could not be written
	Probed     Outcome = "probed"     // a GET /v1/idempotency/{key} lookup
	Incomplete Outcome = "incomplete" // 400: the body could not be read
)

// Request is one request as the server received it.
type Request struct {
	Seq     int       // 1 for the first request, in the order they were read
	Time    time.Time // when the server finished reading it
	Method  string
	Path    string // path with query, as sent
	Header  http.Header
	Body    []byte
	Key     string  // the Idempotency-Key without quotes; "" if none or invalid
	Fault   string  // the injected fault, as Fault.String; "" if none
	Outcome Outcome // what the server decided
	// Status is the status code the server sent; 0 while the response is
	// pending and when none was sent (Reset, AcceptThenClose, Hang, or the
	// client left during Slow or Hold).
	Status int
}

// Effect is one applied side effect: one executed request.
type Effect struct {
	ID     string // the id in the response, "ch_1" for the first
	Seq    int    // the Seq of the request that applied it
	Key    string // the request's key; "" if it had none
	Method string
	Path   string
	Body   []byte
}

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	url       string
	http      *http.Server
	noDedup   bool
	faultFunc func(method, path, key string) Fault
	journal   *os.File      // nil without Options.Journal
	closing   chan struct{} // closed by Close, to end Slow, Hold and Hang
	serveDone chan struct{}
	handlers  sync.WaitGroup
	conns     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	active  int           // handlers running
	changed chan struct{} // closed and replaced on every change waiters look at
	reqs    []Request
	applied []Effect
	keys    map[string]*keyState
	faults  []rule
	// journalErr is the first failed journal write; from then on nothing
	// is applied.
	journalErr error
}

// Start starts a Server and closes it when the test ends.
func Start(tb testing.TB, opts *Options) *Server {
	tb.Helper()
	s, err := New(opts)
	if err != nil {
		tb.Fatalf("start downstream: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("close downstream: %v", err)
		}
	})
	return s
}

// New starts a Server on a free port of 127.0.0.1. Close it with Close.
func New(opts *Options) (*Server, error) {
	if opts == nil {
		opts = &Options{}
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s := &Server{
		noDedup:   opts.NoDedup,
		faultFunc: opts.FaultFunc,
		closing:   make(chan struct{}),
		serveDone: make(chan struct{}),
		changed:   make(chan struct{}),
		keys:      make(map[string]*keyState),
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.url = "http://" + ln.Addr().String()
	// The journal is read once the address is ours: a server killed on
	// it has let go of the port, so it appends nothing more.
	if opts.Journal != "" {
		f, entries, err := openJournal(opts.Journal)
		if err != nil {
			ln.Close()
			return nil, err
		}
		s.journal = f
		s.load(entries)
	}
	s.http = &http.Server{
		Handler: http.HandlerFunc(s.handle),
		// The fake breaks connections on purpose; net/http's complaints about
		// that are noise.
		ErrorLog: log.New(io.Discard, "", 0),
		// Counting connections lets Close wait for net/http's own goroutines,
		// which http.Server.Close does not.
		ConnState: func(_ net.Conn, state http.ConnState) {
			switch state {
			case http.StateNew:
				s.conns.Add(1)
			case http.StateHijacked, http.StateClosed:
				s.conns.Done()
			}
		},
	}
	go func() {
		defer close(s.serveDone)
		_ = s.http.Serve(ln) // always ErrServerClosed or a listener error after Close
	}()
	return s, nil
}

// URL returns the base URL, http://127.0.0.1:port, without a trailing slash.
func (s *Server) URL() string { return s.url }

// Close stops the server: it closes the listener and every connection, ends
// pending Slow, Hold and Hang responses without sending them, and returns once
// no handler is running. Recorded requests stay readable. Closing twice is a
// no-op. With a journal, Close closes it and returns its first write error.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.signal()
	s.mu.Unlock()

	// Connections first, so that no pending request can still be answered.
	err := s.http.Close()
	close(s.closing)
	<-s.serveDone // after Serve returns, no connection is added to s.conns
	s.handlers.Wait()
	s.conns.Wait()
	if err != nil {
		return fmt.Errorf("close server: %w", err)
	}
	if s.journal != nil {
		s.mu.Lock()
		jerr := s.journalErr
		s.mu.Unlock()
		if err := s.journal.Close(); err != nil && jerr == nil {
			jerr = fmt.Errorf("close journal: %w", err)
		}
		return jerr
	}
	return nil
}

// Requests returns a copy of every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.reqs))
	for i, r := range s.reqs {
		r.Header = r.Header.Clone()
		r.Body = slices.Clone(r.Body)
		out[i] = r
	}
	return out
}

// Applied returns a copy of the effects applied so far, in order.
func (s *Server) Applied() []Effect {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Effect, len(s.applied))
	for i, e := range s.applied {
		e.Body = slices.Clone(e.Body)
		out[i] = e
	}
	return out
}

// Keys returns the distinct valid keys received, in the order first seen.
func (s *Server) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	seen := make(map[string]bool)
	for _, r := range s.reqs {
		if r.Key != "" && !seen[r.Key] {
			seen[r.Key] = true
			keys = append(keys, r.Key)
		}
	}
	return keys
}

// Count returns how many requests carried key (unquoted), whatever became of
// them.
func (s *Server) Count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.reqs {
		if r.Key == key {
			n++
		}
	}
	return n
}

// WaitRequests waits until at least n requests have been received. Once it
// returns, the server has decided each of them (its Outcome is set and a
// first request holds its key), though responses may still be pending. It
// fails when ctx ends or the server is closed first.
func (s *Server) WaitRequests(ctx context.Context, n int) error {
	err := s.wait(ctx, func() (bool, error) {
		switch {
		case len(s.reqs) >= n:
			return true, nil
		case s.closed:
			return false, http.ErrServerClosed
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %d requests: %w", n, err)
	}
	return nil
}

// WaitIdle waits until no request is being handled: every pending response
// was sent or given up, and every key is out of flight. It fails when ctx
// ends first.
func (s *Server) WaitIdle(ctx context.Context) error {
	err := s.wait(ctx, func() (bool, error) { return s.active == 0, nil })
	if err != nil {
		return fmt.Errorf("wait for idle: %w", err)
	}
	return nil
}

// wait calls done under s.mu after every change until it reports true or an
// error.
func (s *Server) wait(ctx context.Context, done func() (bool, error)) error {
	for {
		s.mu.Lock()
		ok, err := done()
		changed := s.changed
		s.mu.Unlock()
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// signal wakes every waiter. s.mu must be held.
func (s *Server) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// enter counts a handler in, unless the server is closing: a handler must not
// start after Close began waiting for them.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.active++
	s.handlers.Add(1)
	return true
}

func (s *Server) leave() {
	s.mu.Lock()
	s.active--
	s.signal()
	s.mu.Unlock()
	s.handlers.Done()
}
