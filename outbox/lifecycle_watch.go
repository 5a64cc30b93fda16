package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// unknownDestinationInterval is how often a started dispatcher's layer
// looks for effects pending for a name it does not deliver to. Start
// refuses such effects and Enqueue refuses such names, but rows can
// still arrive: a cooperating upstream of the proxy writes its effects
// in SQL, and a process on the same database that was never started
// accepts any name. Without this, only /readyz and the metric would say
// so, and the next Start would refuse to run.
var unknownDestinationInterval = time.Minute

// testHookUnknownDestinationRound, if set, runs after each look.
var testHookUnknownDestinationRound func()

// watchUnknownDestinations logs a warning, once per name, for each
// destination with pending effects that d does not know, until ctx ends.
// A name whose effects were moved or cancelled is forgotten, so that it
// is named again if it comes back.
func (l *Layer) watchUnknownDestinations(ctx context.Context, d *dispatch.Dispatcher) {
	known := newDestSet(d.Destinations(), "")
	warned := map[string]bool{}
	t := time.NewTicker(unknownDestinationInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pending, err := l.pendingUnknown(ctx, known)
		if err != nil {
			if ctx.Err() == nil {
				l.logger.WarnContext(ctx, "look for effects pending for unknown destinations", "error", err)
			}
		} else {
			for name := range warned {
				if _, still := pending[name]; !still {
					delete(warned, name)
				}
			}
			for name, n := range pending {
				if warned[name] {
					continue
				}
				warned[name] = true
				l.logger.WarnContext(ctx, "effects are pending for a destination this dispatcher does not know; "+
					"they wait, and the next Start refuses to run until they are moved or cancelled",
					slog.String("destination", name), slog.Int64("pending", n), slog.String("known", known.list),
					slog.String("way_out", retargetHint([]string{name})+" (or mcp-outbox outbox cancel --dest "+shellWord(name)+")"))
			}
		}
		if h := testHookUnknownDestinationRound; h != nil {
			h()
		}
	}
}

// pendingUnknown counts the pending effects of each destination outside
// known.
func (l *Layer) pendingUnknown(ctx context.Context, known *destSet) (map[string]int64, error) {
	rows, err := l.db.Read.QueryContext(ctx, pendingByDestination)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var (
			dest string
			n    int64
		)
		if err := rows.Scan(&dest, &n); err != nil {
			return nil, err
		}
		if !known.names[dest] {
			out[dest] = n
		}
	}
	return out, rows.Err()
}
