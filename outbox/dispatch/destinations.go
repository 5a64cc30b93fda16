package dispatch

import "slices"

// Destinations returns the names of the destinations this dispatcher
// delivers to, sorted; empty, not nil, when it has none. An effect pending
// for any other name waits until a process whose dispatcher knows that
// name delivers it: the operator surface reports such effects (readiness,
// metrics, page) by comparing against this set.
func (d *Dispatcher) Destinations() []string {
	names := make([]string, 0, len(d.dests))
	for name := range d.dests {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
