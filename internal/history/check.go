package history

import (
	"fmt"
	"sort"
	"time"
)

// World is what the system holds once every fault has healed and every
// client has stopped: the ground truth the history is checked against.
type World struct {
	// Executions maps a key to the executions of its business write (the
	// charge ids made for it). More than one is a duplicate.
	Executions map[string][]string
	// Effects are the outbox effects the store committed, each with the
	// key of its call and its position.
	Effects []Effect
	// Receipts are the downstream's applied effects, in the order it
	// applied them, by idempotency key.
	Receipts []string
	// Forwarded says the calls were forwarded to a tool server (the
	// proxy): only there does the README allow the state unknown (an
	// outcome lost after forwarding). Elsewhere a read of it is an anomaly.
	Forwarded bool
}

// Effect is one committed outbox effect.
type Effect struct {
	CallKey        string
	Seq            int
	IdempotencyKey string
}

// Anomaly is a violated guarantee, with the operations that show it.
type Anomaly struct {
	Kind string // duplicate, lost, wrong_result, unknown_state, unresolved, nonlinearizable, lin_timeout, undelivered, redelivered, reordered, phantom
	Key  string
	What string
}

func (a Anomaly) String() string { return fmt.Sprintf("%s %s: %s", a.Kind, a.Key, a.What) }

// Check verifies a history against the world:
//
//   - per key at most one execution;
//   - every ok call names that execution, and a key with an ok call has
//     one (a lost write otherwise);
//   - every key a client kept retrying ended with an ok (the campaign's
//     clients retry until one, after the faults heal);
//   - call_status reads and ok calls are linearizable per key against a
//     register that is not_found or in_flight (either, back and forth: a
//     claim is visible, released or not yet committed) until it becomes
//     completed(x) or failed(x), after which it never changes (see
//     [Model]); checked with Porcupine;
//   - every committed effect is applied downstream exactly once, and a
//     call's effects in their order, and nothing else is applied;
//   - no status read says unknown unless the calls were forwarded;
//   - a key made as a task has one task: every handle and poll names
//     the same id, and a handle once given is never not_found;
//   - a task's polls are in the same register as the key's status reads
//     (working is open; completed, failed and cancelled close it), so its
//     status never goes back from an end, nor changes ends; a completed
//     task's result names the key's one execution, and a task that ended
//     failed or cancelled has none.
//
// linTimeout bounds Porcupine's search; a search that times out is
// reported as an anomaly of kind "lin_timeout", not passed.
func Check(ops []Op, w World, linTimeout time.Duration) []Anomaly {
	var out []Anomaly
	keys := map[string]bool{}
	okCall := map[string]bool{}
	for _, o := range ops {
		keys[o.Key] = true
		if o.Kind == Call && o.Outcome == Ok {
			okCall[o.Key] = true
		}
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		ex := w.Executions[k]
		if len(ex) > 1 {
			out = append(out, Anomaly{"duplicate", k, fmt.Sprintf("%d executions %v\n%s", len(ex), ex, Excerpt(ops, k))})
		}
		if okCall[k] && len(ex) == 0 {
			out = append(out, Anomaly{"lost", k, "an ok answer, and no execution\n" + Excerpt(ops, k)})
		}
	}
	for _, o := range ops {
		if o.Kind == Call && o.Outcome == Ok {
			if ex := w.Executions[o.Key]; len(ex) == 1 && ex[0] != o.Result {
				out = append(out, Anomaly{"wrong_result", o.Key, fmt.Sprintf("%s names %s, the execution is %s", o, o.Result, ex[0])})
			}
		}
		if o.Kind == Status && o.Outcome == Ok && o.Result == "completed" {
			if ex := w.Executions[o.Key]; len(ex) != 1 || ex[0] != o.StatusResult {
				out = append(out, Anomaly{"wrong_result", o.Key, fmt.Sprintf("%s reads %s, the executions are %v", o, o.StatusResult, ex)})
			}
		}
		if o.Kind == Status && o.Outcome == Ok && o.Result == "unknown" && !w.Forwarded {
			out = append(out, Anomaly{"unknown_state", o.Key, o.String() + ": unknown, for a call that was not forwarded"})
		}
		if o.Kind == TaskPoll && o.Outcome == Ok {
			switch ex := w.Executions[o.Key]; o.Result {
			case "completed":
				if len(ex) != 1 || ex[0] != o.StatusResult {
					out = append(out, Anomaly{"wrong_result", o.Key, fmt.Sprintf("%s: a completed task names %s, the executions are %v", o, o.StatusResult, ex)})
				}
			case "failed", "cancelled":
				if len(ex) > 0 {
					out = append(out, Anomaly{"wrong_result", o.Key, fmt.Sprintf("%s: the task ended %s, and the key has executions %v", o, o.Result, ex)})
				}
			case "not_found":
				out = append(out, Anomaly{"task_lost", o.Key, o.String() + ": a task whose handle was given is not found"})
			}
		}
		if o.Outcome == "" {
			out = append(out, Anomaly{"unresolved", o.Key, o.String() + " never completed"})
		}
	}
	out = append(out, checkTasks(ops)...)
	out = append(out, checkLinearizable(ops, linTimeout)...)
	out = append(out, checkDelivery(w)...)
	return out
}

// checkTasks checks that a key has one task, and that each client's polls
// of a task, in its order, never leave an end once read.
func checkTasks(ops []Op) []Anomaly {
	var out []Anomaly
	taskOf := map[string]string{}
	type clientTask struct {
		client int
		task   string
	}
	end := map[clientTask]Op{}
	for _, o := range ops {
		if o.Outcome != Ok || o.Task == "" || (o.Kind != TaskCall && o.Kind != TaskPoll) {
			continue
		}
		if t, ok := taskOf[o.Key]; ok && t != o.Task {
			out = append(out, Anomaly{"two_tasks", o.Key, fmt.Sprintf("tasks %s and %s for one key\n%s", t, o.Task, Excerpt(ops, o.Key))})
		}
		taskOf[o.Key] = o.Task
		if o.Kind != TaskPoll {
			continue
		}
		ct := clientTask{o.Client, o.Task}
		if prev, ok := end[ct]; ok && (prev.Result != o.Result || prev.StatusResult != o.StatusResult) {
			out = append(out, Anomaly{"task_regressed", o.Key, fmt.Sprintf("%s after %s", o, prev)})
		}
		if TaskEnded(o.Result) {
			end[ct] = o
		}
	}
	return out
}

// TaskEnded says whether a task status is an end.
func TaskEnded(status string) bool {
	return status == "completed" || status == "failed" || status == "cancelled"
}

// lastOutcome returns, per key, the outcome of its last call attempt.
func LastCallOutcome(ops []Op) map[string]Op {
	last := map[string]Op{}
	for _, o := range ops {
		if o.Kind == Call && o.Attempt >= last[o.Key].Attempt {
			last[o.Key] = o
		}
	}
	return last
}

func checkDelivery(w World) []Anomaly {
	var out []Anomaly
	applied := map[string]int{}
	pos := map[string]int{}
	for i, r := range w.Receipts {
		applied[r]++
		if _, ok := pos[r]; !ok {
			pos[r] = i
		}
	}
	byCall := map[string][]Effect{}
	committed := map[string]bool{}
	for _, e := range w.Effects {
		committed[e.IdempotencyKey] = true
		byCall[e.CallKey] = append(byCall[e.CallKey], e)
		switch n := applied[e.IdempotencyKey]; {
		case n == 0:
			out = append(out, Anomaly{"undelivered", e.CallKey, fmt.Sprintf("effect %d (%s) committed, never applied downstream", e.Seq, e.IdempotencyKey)})
		case n > 1:
			out = append(out, Anomaly{"redelivered", e.CallKey, fmt.Sprintf("effect %d (%s) applied %d times", e.Seq, e.IdempotencyKey, n)})
		}
	}
	for r := range applied {
		if !committed[r] {
			out = append(out, Anomaly{"phantom", r, "applied downstream, but no committed effect has this key"})
		}
	}
	for k, es := range byCall {
		sort.Slice(es, func(i, j int) bool { return es[i].Seq < es[j].Seq })
		for i := 1; i < len(es); i++ {
			a, okA := pos[es[i-1].IdempotencyKey]
			b, okB := pos[es[i].IdempotencyKey]
			if okA && okB && a > b {
				out = append(out, Anomaly{"reordered", k, fmt.Sprintf("effect %d applied before effect %d", es[i].Seq, es[i-1].Seq)})
			}
		}
	}
	return out
}
