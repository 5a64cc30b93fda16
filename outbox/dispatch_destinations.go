package outbox

import (
	"maps"
	"slices"
)

// Destinations returns the names of the destinations this dispatcher
// delivers to, sorted. An effect pending for any other name waits until a
// process whose dispatcher knows that name delivers it: the operator
// surface reports such effects (readiness, metrics, page) by comparing
// against this set.
func (d *Dispatcher) Destinations() []string {
	return slices.Sorted(maps.Keys(d.dests))
}
