package history

import (
	"fmt"
	"time"

	"github.com/anishathalye/porcupine"
)

// The register a key's status reads observe, from the README's states:
// not_found and in_flight are open (a claim appears, is released when an
// attempt fails before its commit, and may be invisible to other
// processes while its batch is open, so reads may go either way between
// them); completed and failed are closed, each with the execution its
// recorded result names, and never change once reached (retention, which
// turns them back into not_found, is a day: beyond any campaign). unknown,
// a forwarded call's lost outcome, is closed too; serve never forwards.
type regState struct {
	closed bool
	phase  string // completed, failed or unknown once closed
	result string
}

// input and output of a linearized operation.
type linIn struct{ kind Kind }
type linOut struct {
	state, result string
}

// Model is the per-key Porcupine model: a status read that returns an
// open state is allowed only before the key closed; one that returns a
// closed state closes it (the commit linearizes at the latest there) or
// must match it; an ok call closes it as completed with its result, or
// matches it (a replay).
var Model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, o := range h {
			k := o.Metadata.(string)
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return regState{} },
	Step: func(s, in, out any) (bool, any) {
		st, o := s.(regState), out.(linOut)
		switch o.state {
		case "not_found", "in_flight":
			return !st.closed, st
		case "completed", "failed", "unknown":
			if st.closed {
				return st.phase == o.state && st.result == o.result, st
			}
			return true, regState{closed: true, phase: o.state, result: o.result}
		}
		return false, st
	},
	DescribeOperation: func(in, out any) string {
		o := out.(linOut)
		return fmt.Sprintf("%s -> %s %s", in.(linIn).kind, o.state, o.result)
	},
}

// checkLinearizable runs Porcupine over the ok status reads, ok calls and
// ok task polls (a task's status is its call's state: working while the
// call is in flight, completed with its result, failed or cancelled as a
// call that ended failed without a result).
// Calls that failed or whose outcome is unknown are left out: a failed one
// changed nothing by itself, and an unknown one may have closed the key at
// any time, which the model allows anyway (a closing read or a later ok
// call linearizes the commit).
func checkLinearizable(ops []Op, timeout time.Duration) []Anomaly {
	var lin []porcupine.Operation
	for _, o := range ops {
		if o.Outcome != Ok {
			continue
		}
		var out linOut
		switch o.Kind {
		case Call:
			out = linOut{"completed", o.Result}
		case Status:
			out = linOut{o.Result, o.StatusResult}
		case TaskPoll:
			switch o.Result {
			case "working":
				out = linOut{"in_flight", ""}
			case "completed":
				out = linOut{"completed", o.StatusResult}
			case "failed", "cancelled":
				out = linOut{"failed", ""}
			default:
				continue // not_found: an anomaly of its own
			}
		default:
			continue
		}
		lin = append(lin, porcupine.Operation{ClientId: o.Client, Input: linIn{o.Kind}, Output: out,
			Call: int64(o.Invoke), Return: int64(o.Complete), Metadata: o.Key})
	}
	res, info := porcupine.CheckOperationsVerbose(Model, lin, timeout)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return []Anomaly{{"lin_timeout", "", fmt.Sprintf("Porcupine gave up after %v on %d operations", timeout, len(lin))}}
	}
	// Name the keys whose partition has no full linearization.
	var out []Anomaly
	parts := Model.Partition(lin)
	for i, p := range parts {
		if porcupine.CheckOperations(Model, p) {
			continue
		}
		k := p[0].Metadata.(string)
		out = append(out, Anomaly{"nonlinearizable", k, fmt.Sprintf("partition %d: reads and answers no single order explains\n%s", i, Excerpt(ops, k))})
	}
	_ = info
	return out
}
