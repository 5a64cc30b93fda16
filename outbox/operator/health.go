package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/layerinfo"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// NewHealth returns the health checks, at these paths under
// Options.BasePath:
//
//	GET healthz   200 "ok" while the process serves
//	GET readyz    200 when the database takes writes and has this binary's
//	              schema and Options.Dispatcher runs, else 503
//
// readyz answers JSON: {"ready": bool, "status": "ok" | "degraded" |
// "unavailable", "checks": {name: reason}}. Degraded is still ready (200),
// with the reason in its check:
//
//   - checks.dispatcher: Options.Layer was never started, so nothing in
//     this process delivers the effects its calls enqueue (they are kept,
//     and wait for a dispatcher);
//   - checks.destinations: effects are pending for a destination the
//     dispatcher does not know, named there.
//
// Ready, because the process does serve calls, and what they enqueue is
// committed: taking it out of a load balancer would stop the calls and
// deliver nothing more. A dispatcher that ran and stopped (Runner.Stop,
// during a shutdown) is unavailable (503), as before. Reasons are generic; the database's error is in
// the log, never in the answer, which anyone who can reach it reads. The
// checks are public, as load balancers expect: they name no tool and no
// key, only destinations.
func NewHealth(db *schema.DB, opts *Options) http.Handler {
	o := mustOptions(opts)
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	rd := &readiness{db: db, dispatcher: o.Dispatcher, logger: o.Logger}
	if _, ok := o.Dispatcher.(layerDispatcher); ok {
		rd.layer = o.Layer // else a dispatcher of its own delivers
	}
	r.Get("/readyz", rd.ServeHTTP)
	return underBase(o.BasePath, r)
}

// readiness answers readyz.
type readiness struct {
	db         *schema.DB
	dispatcher Dispatcher
	layer      *outbox.Layer // nil: judge by dispatcher alone
	logger     *slog.Logger
}

// notStarted is checks.dispatcher of a layer never started.
const notStarted = "not started: nothing in this process delivers the effects its calls enqueue; they wait " +
	"(Layer.Start runs the dispatcher, StartOptions.NoDispatcher says another process delivers)"

// destinationsUnchecked is checks.destinations of a layer never started.
const destinationsUnchecked = "unchecked: the layer was not started, so no dispatcher names the destinations " +
	"its effects must have"

func (rd *readiness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	checks := map[string]string{"database": "ok", "dispatcher": "ok"}
	ready, degraded := true, false
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := rd.db.CheckReady(ctx); err != nil {
		rd.logger.Error("readiness: database not ready", "error", err)
		checks["database"], ready = "not ready: see the server's log", false
	}
	switch {
	case rd.layer != nil && !layerinfo.Of(rd.layer).Started():
		checks["dispatcher"], degraded = notStarted, true
	case rd.dispatcher != nil && !rd.dispatcher.Running():
		checks["dispatcher"], ready = "not running", false
	}
	if ready && rd.layer != nil && !layerinfo.Of(rd.layer).Started() {
		// No dispatcher names the destinations to judge by: "ok" here would
		// vouch for effects whose names nothing has checked.
		checks["destinations"] = destinationsUnchecked
	} else if ready {
		switch u, err := findUnconfigured(ctx, rd.db, rd.dispatcher); {
		case err != nil:
			rd.logger.Error("readiness: count pending effects", "error", err)
			checks["destinations"], degraded = "unchecked: see the server's log", true
		case len(u) > 0 && len(rd.dispatcher.Destinations()) == 0:
			// mcp-outbox serve without --dest: nothing here delivers at all.
			checks["destinations"], degraded = "effects pending, and this process delivers to no destination: "+
				unconfiguredNames(u), true
		case len(u) > 0:
			checks["destinations"], degraded = "effects pending for destinations this dispatcher does not know: "+
				unconfiguredNames(u), true
		case rd.dispatcher != nil:
			checks["destinations"] = "ok"
		}
	}
	status := "ok"
	switch {
	case !ready:
		status = "unavailable"
	case degraded:
		status = "degraded"
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": ready, "status": status, "checks": checks})
}

// unconfiguredNames lists the names for a message, bounded: the names come
// from whatever enqueued the effects.
func unconfiguredNames(u []unconfiguredDest) string {
	const most = 10
	var names []string
	for i, d := range u {
		if i == most {
			names = append(names, fmt.Sprintf("and %d more", len(u)-most))
			break
		}
		names = append(names, operate.Shorten(d.Destination, 60))
	}
	return strings.Join(names, ", ")
}
