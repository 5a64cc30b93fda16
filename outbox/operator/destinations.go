package operator

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The bulk actions on one destination's pending effects, in the admin API
// and on the page: move them to another destination (retarget), or cancel
// them. The way out of effects enqueued for a name no dispatcher delivers
// to, which otherwise wait forever and keep Layer.Start from running.

// retargetTargets are the destinations effects may be moved to: this
// process's dispatcher's, when it knows them (moving effects to a name it
// does not deliver to would leave them as stuck as before); without one,
// those the database has delivered to.
func retargetTargets(ctx context.Context, db *schema.DB, d Dispatcher) ([]string, error) {
	if d != nil {
		if names := d.Destinations(); names != nil {
			return slices.Sorted(slices.Values(names)), nil
		}
	}
	return operate.KnownDestinations(ctx, db, nil)
}

// retarget is POST /effects/retarget {"from": NAME, "to": NAME}.
func (h *adminHandler) retarget(w http.ResponseWriter, r *http.Request) {
	var body struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	if err := readAdminBody(w, r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := operate.CheckRetarget(body.From, body.To); err != nil {
		h.fail(w, r, err)
		return
	}
	known, err := retargetTargets(r.Context(), h.db, h.dispatcher)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := operate.RetargetPending(r.Context(), h.db, body.From, body.To, known)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// The admin token names no user; the log is the audit trail.
	h.logger.Info("admin action", "action", "retarget", "from", res.Destination, "to", res.To, "effects", res.Effects,
		"remote", r.RemoteAddr, "by", operatorOf(r))
	writeAdminJSON(w, http.StatusOK, res)
}

// cancelDestination is POST /effects/cancel-pending {"destination": NAME}.
func (h *adminHandler) cancelDestination(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Destination string `json:"destination"`
	}
	if err := readAdminBody(w, r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := operate.CancelPendingOf(r.Context(), h.db, body.Destination)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.logger.Info("admin action", "action", "cancel-destination", "destination", res.Destination, "effects", res.Effects,
		"remote", r.RemoteAddr, "by", operatorOf(r))
	writeAdminJSON(w, http.StatusOK, res)
}

// retarget is the page's form for one unconfigured destination: fields
// from and to.
func (p *pageHandler) retarget(w http.ResponseWriter, r *http.Request) {
	form, err := readPageForm(w, r, "from", "to")
	if err != nil {
		p.redirectFailed(w, r, "retarget", err)
		return
	}
	from, to := form.Get("from"), form.Get("to")
	if err := operate.CheckRetarget(from, to); err != nil {
		p.redirectFailed(w, r, "retarget", err)
		return
	}
	known, err := retargetTargets(r.Context(), p.db, p.dispatcher)
	if err != nil {
		p.redirectFailed(w, r, "retarget", err)
		return
	}
	res, err := operate.RetargetPending(r.Context(), p.db, from, to, known)
	if err != nil {
		p.redirectFailed(w, r, "retarget", err)
		return
	}
	p.logger.Info("operator page action", "action", "retarget", "from", res.Destination, "to", res.To, "effects", res.Effects,
		"remote", r.RemoteAddr, "by", operatorOf(r))
	p.redirectFlash(w, r, flashDone, fmt.Sprintf("Moved %d pending effects from %s to %s: they are due now.",
		res.Effects, operate.Shorten(res.Destination, 60), operate.Shorten(res.To, 60)))
}

// cancelDestination is the page's form that cancels one destination's
// pending effects: field destination.
func (p *pageHandler) cancelDestination(w http.ResponseWriter, r *http.Request) {
	form, err := readPageForm(w, r, "destination")
	if err != nil {
		p.redirectFailed(w, r, "cancel-destination", err)
		return
	}
	res, err := operate.CancelPendingOf(r.Context(), p.db, form.Get("destination"))
	if err != nil {
		p.redirectFailed(w, r, "cancel-destination", err)
		return
	}
	p.logger.Info("operator page action", "action", "cancel-destination", "destination", res.Destination, "effects", res.Effects,
		"remote", r.RemoteAddr, "by", operatorOf(r))
	p.redirectFlash(w, r, flashDone, fmt.Sprintf("Cancelled %d pending effects of %s.", res.Effects, operate.Shorten(res.Destination, 60)))
}
