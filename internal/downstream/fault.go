package downstream

import (
	"fmt"
	"time"
)

// Fault is a failure injected into a request. The zero Fault is no fault.
// The package documentation lists, for each, whether the effect is applied.
type Fault struct {
	kind       faultKind
	status     int
	retryAfter string
	delay      time.Duration
	release    <-chan struct{}
	path       string // only requests to this path match; "" any but lookups
	key        string // only requests with this key match; "" any
}

type faultKind int

const (
	noFault faultKind = iota
	statusFault
	retryAfterFault
	resetFault
	acceptThenCloseFault
	slowFault
	holdFault
	hangFault
)

// Status answers code with a JSON error before execution: the effect is not
// applied and nothing is saved for the key.
func Status(code int) Fault { return Fault{kind: statusFault, status: code} }

// RetryAfter is Status(code) with the header Retry-After: value, in seconds
// or as an HTTP-date.
func RetryAfter(code int, value string) Fault {
	return Fault{kind: retryAfterFault, status: code, retryAfter: value}
}

// Reset reads the request, then closes the connection with a TCP RST
// (SO_LINGER 0) without responding. The effect is not applied.
func Reset() Fault { return Fault{kind: resetFault} }

// AcceptThenClose reads and handles the request (an executed request applies
// its effect and saves its response), then closes the connection without
// responding: the response is lost, and a retry with the key gets it replayed.
func AcceptThenClose() Fault { return Fault{kind: acceptThenCloseFault} }

// Slow handles the request (an executed request applies its effect), then
// sends the response d later, or never if the client leaves first.
func Slow(d time.Duration) Fault { return Fault{kind: slowFault, delay: d} }

// Hold is Slow until release is closed: it lets a test act while the request
// is in flight.
func Hold(release <-chan struct{}) Fault { return Fault{kind: holdFault, release: release} }

// Hang handles the request (an executed request applies its effect) and never
// responds; the request ends when the client leaves or the server closes.
func Hang() Fault { return Fault{kind: hangFault} }

// ForPath returns f restricted to requests whose path, without query, is
// path. Lookups (GET /v1/idempotency/{key}) get only faults restricted to
// their path, so that faults meant for effects do not break them.
func (f Fault) ForPath(path string) Fault {
	f.path = path
	return f
}

// ForKey returns f restricted to requests whose Idempotency-Key, unquoted, is
// key.
func (f Fault) ForKey(key string) Fault {
	f.key = key
	return f
}

// String names the fault, without its restrictions, as in Request.Fault.
func (f Fault) String() string {
	switch f.kind {
	case statusFault:
		return fmt.Sprintf("status %d", f.status)
	case retryAfterFault:
		return fmt.Sprintf("status %d retry-after %s", f.status, f.retryAfter)
	case resetFault:
		return "reset"
	case acceptThenCloseFault:
		return "accept-then-close"
	case slowFault:
		return fmt.Sprintf("slow %v", f.delay)
	case holdFault:
		return "hold"
	case hangFault:
		return "hang"
	}
	return ""
}

func (f Fault) matches(path string, lookup bool, key string) bool {
	if f.path == "" && lookup || f.path != "" && f.path != path {
		return false
	}
	return f.key == "" || f.key == key
}

type rule struct {
	fault Fault
	left  int
}

// FailNext injects f into the next n requests it matches (see ForPath and
// ForKey). Faults are queued: a request gets the first queued fault that
// matches it, so FailNext(1, Status(503)) then FailNext(1, Reset()) fails
// the next request with 503 and the one after with a reset. A request whose
// body cannot be read takes no fault.
func (s *Server) FailNext(n int, f Fault) {
	if n < 1 || f.kind == noFault {
		panic(fmt.Sprintf("downstream: FailNext(%d, %q): want n >= 1 and a fault", n, f))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, rule{fault: f, left: n})
}

// takeFault consumes the first queued fault matching a request. s.mu must
// be held.
func (s *Server) takeFault(path string, lookup bool, key string) Fault {
	for i := range s.faults {
		r := &s.faults[i]
		if !r.fault.matches(path, lookup, key) {
			continue
		}
		f := r.fault
		if r.left--; r.left == 0 {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
		}
		return f
	}
	return Fault{}
}
