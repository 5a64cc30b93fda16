// Package history records what the clients of a fault campaign saw, one
// operation at a time with its invoke and complete times, the way Jepsen's
// histories do, and checks it against what the store and the downstream
// hold at the end (see [Check]).
//
// An operation's outcome is ok (the system answered, and the answer is
// definite), fail (the system said, definitely, that nothing was done by
// this attempt) or info (the answer was lost: a timeout, a reset
// connection; the operation may or may not have taken effect). Only info
// operations leave a question open, and the campaign answers it the way a
// client should: it retries under the same key until an ok.
package history

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Kind is what an operation did.
type Kind string

const (
	// Call is a tools/call of a side-effecting tool under an idempotency key.
	Call Kind = "call"
	// Status is a call_status read of a key.
	Status Kind = "status"
	// TaskCall is a tools/call that asks for a task (the Tasks
	// extension): ok when it answers with a task's handle (Op.Task).
	TaskCall Kind = "task_call"
	// TaskPoll is a tasks/get of the task a call runs as: Result is the
	// status read (working, completed, failed, cancelled, or not_found),
	// StatusResult, for a completed one, the execution its result names.
	TaskPoll Kind = "task_poll"
)

// Outcome is how an operation ended, in Jepsen's terms.
type Outcome string

const (
	Ok   Outcome = "ok"
	Fail Outcome = "fail"
	Info Outcome = "info"
)

// Op is one operation as a client saw it.
type Op struct {
	ID      int
	Client  int
	Kind    Kind
	Key     string
	Attempt int    // 1 for the first try of a key, 2 for its first retry...
	Target  string // the replica or front the request went to, when known
	// Invoke and Complete are offsets from the history's start, on the
	// monotonic clock; Complete is zero while the operation is pending.
	Invoke, Complete time.Duration
	Outcome          Outcome
	// Result is, for an ok call, the execution it names (the charge id);
	// for a status read, the state read ("not_found", "in_flight",
	// "completed", "failed", "unknown"), and for a completed one
	// StatusResult holds the execution its recorded result names.
	Result       string
	StatusResult string
	// Task is the task's id, for task calls and polls.
	Task string
	// Reason says why a fail or info operation ended so.
	Reason string
	// Fault names the faults the nemesis had injected when the operation
	// was invoked, joined by "+" ("" for none), for the summary per fault.
	Fault string
}

func (o Op) String() string {
	s := fmt.Sprintf("#%d c%d %s %s try%d [%v..%v] %s", o.ID, o.Client, o.Kind, o.Key, o.Attempt,
		o.Invoke.Round(time.Millisecond), o.Complete.Round(time.Millisecond), o.Outcome)
	if o.Task != "" {
		s += " task " + o.Task
	}
	if o.Result != "" {
		s += " " + o.Result
	}
	if o.StatusResult != "" {
		s += "=" + o.StatusResult
	}
	if o.Reason != "" {
		s += " (" + o.Reason + ")"
	}
	return s
}

// History is a concurrent log of operations.
type History struct {
	start  time.Time
	mu     sync.Mutex
	ops    []Op
	faults map[string]int // in effect now, with how many of each
}

// FaultBegin notes a fault in effect from now on, FaultEnd its heal;
// faults may overlap. Operations invoked meanwhile carry their names.
func (h *History) FaultBegin(name string) {
	h.mu.Lock()
	h.faults[name]++
	h.mu.Unlock()
}

// FaultEnd notes the heal of a fault FaultBegin noted.
func (h *History) FaultEnd(name string) {
	h.mu.Lock()
	if h.faults[name]--; h.faults[name] <= 0 {
		delete(h.faults, name)
	}
	h.mu.Unlock()
}

// faultNow names the faults in effect, sorted, joined by "+"; h.mu held.
func (h *History) faultNow() string {
	names := make([]string, 0, len(h.faults))
	for f := range h.faults {
		names = append(names, f)
	}
	sort.Strings(names)
	return strings.Join(names, "+")
}

// New starts an empty history; times are offsets from now.
func New() *History { return &History{start: time.Now(), faults: map[string]int{}} }

// Pending is an operation invoked and not yet completed.
type Pending struct {
	h *History
	i int
}

// SetTask names the task an operation (a task call, before it ends, or
// a poll) is about.
func (p *Pending) SetTask(id string) {
	p.h.mu.Lock()
	p.h.ops[p.i].Task = id
	p.h.mu.Unlock()
}

// Invoke records the start of an operation.
func (h *History) Invoke(client int, kind Kind, key string, attempt int, target string) *Pending {
	now := time.Since(h.start)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, Op{ID: len(h.ops), Client: client, Kind: kind, Key: key, Attempt: attempt, Target: target, Invoke: now, Fault: h.faultNow()})
	return &Pending{h: h, i: len(h.ops) - 1}
}

// End records how the operation ended.
func (p *Pending) End(outcome Outcome, result, statusResult, reason string) {
	now := time.Since(p.h.start)
	p.h.mu.Lock()
	defer p.h.mu.Unlock()
	o := &p.h.ops[p.i]
	o.Complete, o.Outcome, o.Result, o.StatusResult, o.Reason = now, outcome, result, statusResult, reason
}

// Ops returns a copy of the operations, in invoke order.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Excerpt returns the operations on key, one a line, for a report.
func Excerpt(ops []Op, key string) string {
	var b strings.Builder
	for _, o := range ops {
		if o.Key == key {
			b.WriteString(o.String())
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Counts tallies operations by kind and outcome, and info operations by
// reason, for a summary.
type Counts struct {
	ByKind  map[Kind]map[Outcome]int
	InfoWhy map[string]int
	// ByFault counts outcomes by each fault active at invoke ("none"
	// outside faults; an operation under two overlapping faults counts
	// under both); Why counts fail and info reasons by the faults in
	// effect ("blackhole+slow" for two at once).
	ByFault map[string]map[Outcome]int
	Why     map[string]int
	Total   int
	Retries int // operations with Attempt > 1
	Pending int // operations still pending at the end (none, once clients stop)
}

// Count tallies ops.
func Count(ops []Op) Counts {
	c := Counts{ByKind: map[Kind]map[Outcome]int{}, InfoWhy: map[string]int{}, ByFault: map[string]map[Outcome]int{}, Why: map[string]int{}}
	for _, o := range ops {
		c.Total++
		if c.ByKind[o.Kind] == nil {
			c.ByKind[o.Kind] = map[Outcome]int{}
		}
		if o.Outcome == "" {
			c.Pending++
			continue
		}
		c.ByKind[o.Kind][o.Outcome]++
		if o.Attempt > 1 {
			c.Retries++
		}
		fault := o.Fault
		if fault == "" {
			fault = "none"
		}
		for _, f := range strings.Split(fault, "+") {
			if c.ByFault[f] == nil {
				c.ByFault[f] = map[Outcome]int{}
			}
			c.ByFault[f][o.Outcome]++
		}
		if o.Outcome != Ok {
			c.InfoWhy[string(o.Kind)+" "+string(o.Outcome)+": "+o.Reason]++
			c.Why[fault+" | "+string(o.Kind)+" "+string(o.Outcome)+": "+o.Reason]++
		}
	}
	return c
}

// Reasons lists InfoWhy sorted by count, most first.
func (c Counts) Reasons() []string { return sortedCounts(c.InfoWhy) }

// ReasonsByFault lists Why, sorted by count, most first.
func (c Counts) ReasonsByFault() []string { return sortedCounts(c.Why) }

func sortedCounts(m map[string]int) []string {
	var out []string
	for r, n := range m {
		out = append(out, fmt.Sprintf("%6d  %s", n, r))
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	return out
}
