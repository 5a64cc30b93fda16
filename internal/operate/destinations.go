package operate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The bulk actions on one destination's pending effects (retarget, and
// cancel by destination), shared by the command line, the admin API and
// the page. The way out of a typo'd destination: its effects wait
// forever, and a Start that knows the right name refuses to run.

// maxDestName bounds a destination name an operator gives; names are
// short identifiers, so a longer one is a mistake.
const maxDestName = 200

// DestinationResult is what a bulk action on a destination did.
type DestinationResult struct {
	Action      string `json:"action"` // retarget or cancel
	Destination string `json:"destination"`
	To          string `json:"to,omitempty"` // retarget's new destination
	Effects     int64  `json:"effects"`      // how many pending effects were moved or cancelled
}

// CheckRetarget validates a retarget's names before anything is opened.
func CheckRetarget(from, to string) error {
	if err := checkDestName("from", from); err != nil {
		return err
	}
	if err := checkDestName("to", to); err != nil {
		return err
	}
	if from == to {
		return BadInputf("from and to are both %q: nothing to move", from)
	}
	return nil
}

func checkDestName(what, name string) error {
	switch {
	case name == "":
		return BadInputf("%s: give a destination name", what)
	case len(name) > maxDestName:
		return BadInputf("%s: a destination name of %d bytes; names are at most %d", what, len(name), maxDestName)
	}
	return nil
}

// KnownDestinations are the names a retarget may move effects to:
// configured (the dispatcher's, or the destination configuration the
// command line reads), and any the database has delivered to, which a
// dispatcher on it knew. Sorted, without duplicates.
func KnownDestinations(ctx context.Context, db *schema.DB, configured []string) ([]string, error) {
	known := slices.Clone(configured)
	counts, err := opsquery.CountEffectsByDestination(ctx, db)
	if err != nil {
		return nil, err
	}
	for _, c := range counts {
		if c.Delivered > 0 {
			known = append(known, c.Destination)
		}
	}
	slices.Sort(known)
	return slices.Compact(known), nil
}

// RetargetPending validates a retarget against the known destinations
// and moves from's pending effects to to (admin.RetargetPending). A to
// that is not known is refused, naming the known ones: moving effects to
// another typo would only move the problem. None pending for from is
// admin.ErrNoPending, naming the destinations that have pending effects.
func RetargetPending(ctx context.Context, db *schema.DB, from, to string, known []string) (*DestinationResult, error) {
	if err := CheckRetarget(from, to); err != nil {
		return nil, err
	}
	if !slices.Contains(known, to) {
		return nil, BadInputf("to %q: no destination of that name is configured or was ever delivered to (known: %s); "+
			"nothing was moved", to, quotedList(known))
	}
	n, err := admin.RetargetPending(ctx, db, from, to)
	if err != nil {
		return nil, withPendingNames(ctx, db, err)
	}
	return &DestinationResult{Action: "retarget", Destination: from, To: to, Effects: n}, nil
}

// CheckDestName validates the destination of a cancel by destination.
func CheckDestName(dest string) error { return checkDestName("cancel by destination", dest) }

// CancelPendingOf validates and cancels dest's pending effects
// (admin.CancelPending).
func CancelPendingOf(ctx context.Context, db *schema.DB, dest string) (*DestinationResult, error) {
	if err := CheckDestName(dest); err != nil {
		return nil, err
	}
	n, err := admin.CancelPending(ctx, db, dest)
	if err != nil {
		return nil, withPendingNames(ctx, db, err)
	}
	return &DestinationResult{Action: "cancel", Destination: dest, Effects: n}, nil
}

// withPendingNames adds to an admin.ErrNoPending the destinations that do
// have pending effects: the name given was most likely not the one the
// effects carry.
func withPendingNames(ctx context.Context, db *schema.DB, err error) error {
	if !errors.Is(err, admin.ErrNoPending) {
		return err
	}
	counts, cerr := opsquery.CountEffectsByDestination(ctx, db)
	if cerr != nil {
		return err
	}
	var names []string
	for _, c := range counts {
		if c.Pending > 0 {
			names = append(names, fmt.Sprintf("%q (%d)", c.Destination, c.Pending))
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("%w; no destination has pending effects", err)
	}
	return fmt.Errorf("%w; pending effects are for %s", err, strings.Join(names, ", "))
}

func quotedList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
