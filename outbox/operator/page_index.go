package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/query"
)

// The page itself (GET /), the lookup of one call, and the buttons that
// act on effects.

// indexData is everything the page shows.
type indexData struct {
	DBPath   string
	Now      time.Time
	LoggedIn bool // with a session cookie: offer to log out
	Flash    *flash
	Summary  operate.EffectSummary
	ByDest   []opsquery.DestinationCounts
	Stuck    []opsquery.StuckEffect
	// UnknownCalls are the newest of Summary.UnknownCalls.
	UnknownCalls []pageUnknownCall
	Calls        []opsquery.CallRow
	Chart        chart
	Lookup       *lookupResult
	// Unconfigured are the destinations with effects pending that this
	// process's dispatcher does not know; UnconfiguredSet has their names.
	Unconfigured    []unconfiguredDest
	UnconfiguredSet map[string]bool
	// Targets are the destinations the effects of an unconfigured one
	// may be moved to (retargetTargets).
	Targets []string
}

type lookupResult struct {
	Principal, Key string
	Error          string
	Status         *query.Status
	EffectIDs      map[int]int64
	Result         string
}

// effectRef is what the action buttons of one effect need.
type effectRef struct {
	ID    int64
	State string
}

func (p *pageHandler) index(w http.ResponseWriter, r *http.Request) {
	p.show(w, r, nil)
}

// show renders the page, with the answer to a lookup when there is one.
func (p *pageHandler) show(w http.ResponseWriter, r *http.Request, lookup *lookupResult) {
	now := time.Now().UTC()
	d := indexData{DBPath: p.db.Path, Now: now, Lookup: lookup, Flash: p.readFlash(r.URL.Query()),
		LoggedIn: p.auth.tokenRequired() && p.loggedIn(r)}
	window := chartWindows[0]
	for _, cw := range chartWindows {
		if r.URL.Query().Get("window") == cw.Name {
			window = cw
		}
	}
	if err := p.read(r.Context(), &d, window); err != nil {
		id := logFault(r.Context(), p.logger, "operator page failed", err)
		p.errorPage(w, http.StatusInternalServerError, "Reading the database failed; the server's log has the error under error_id="+id+".")
		return
	}
	p.render(w, http.StatusOK, "index", d)
}

// read fills in what the page shows from the database.
func (p *pageHandler) read(ctx context.Context, d *indexData, window chartWindow) (err error) {
	// One count of the effects for both the totals and the destinations:
	// each reads every effect's index entry.
	if d.ByDest, err = opsquery.CountEffectsByDestination(ctx, p.db); err != nil {
		return err
	}
	var all opsquery.Counts
	for _, bd := range d.ByDest {
		all = all.Plus(bd.Counts)
	}
	unknownCalls, err := opsquery.CountUnknownCalls(ctx, p.db)
	if err != nil {
		return err
	}
	d.Summary = operate.EffectSummary{Counts: all, Total: all.Total(), UnknownCalls: unknownCalls}
	if d.Stuck, err = opsquery.ListStuckEffects(ctx, p.db, pageStuckLimit); err != nil {
		return err
	}
	if d.UnknownCalls, err = listPageUnknownCalls(ctx, p.db.Read, operate.PageUnknownCalls); err != nil {
		return err
	}
	if d.Calls, err = opsquery.RecentCalls(ctx, p.db, pageCallsLimit); err != nil {
		return err
	}
	buckets, err := opsquery.DeliveryHistory(ctx, p.db, window.end(d.Now), window.Step, window.Buckets)
	if err != nil {
		return err
	}
	d.Chart = newChart(window, buckets)
	if d.Unconfigured, err = findUnconfigured(ctx, p.db, p.dispatcher); err != nil {
		return err
	}
	d.UnconfiguredSet = map[string]bool{}
	for _, u := range d.Unconfigured {
		d.UnconfiguredSet[u.Destination] = true
	}
	if len(d.Unconfigured) > 0 {
		if d.Targets, err = retargetTargets(ctx, p.db, p.dispatcher); err != nil {
			return err
		}
	}
	return nil
}

func (p *pageHandler) lookupCall(w http.ResponseWriter, r *http.Request) {
	res := &lookupResult{}
	form, err := readPageForm(w, r, "principal", "key")
	if err == nil {
		res.Principal, res.Key = strings.TrimSpace(form.Get("principal")), form.Get("key")
		err = p.findCall(r.Context(), res)
	}
	if err != nil {
		res.Error = err.Error()
		if !refusal(err) {
			res.Error = "Looking up the call failed: " + faultText(logFault(r.Context(), p.logger, "operator page lookup failed", err)) + "."
		}
	}
	// The answer is rendered, not redirected to: a key in a URL would end
	// up in the browser's history and in proxies' logs, which this project
	// keeps keys out of.
	p.show(w, r, res)
}

// findCall looks up the call res names and fills in the rest of res.
func (p *pageHandler) findCall(ctx context.Context, res *lookupResult) error {
	// local, a token's principal (alice), or as the calls table stores it
	// (user:alice).
	principal := callkey.ParsePrincipal(res.Principal)
	if len(principal) > maxPagePrincipal || strings.ContainsFunc(principal, unicode.IsControl) {
		return operate.BadInputf("principal %q: want local, or a token's principal such as alice", operate.Shorten(res.Principal, 40))
	}
	if res.Key == "" {
		return operate.BadInputf("give the call's idempotency key")
	}
	if err := callkey.Validate(res.Key); err != nil {
		return operate.BadInput{Err: err}
	}
	st, err := query.LookupSealed(ctx, p.db, p.keys, principal, res.Key, time.Now())
	if err != nil {
		return err
	}
	res.Status = st
	if len(st.Result) > 0 {
		var b bytes.Buffer
		if json.Indent(&b, st.Result, "", "  ") != nil {
			b.Reset()
			b.Write(st.Result)
		}
		res.Result = b.String()
		if utf8.RuneCountInString(res.Result) > pageResultLimit {
			res.Result = string([]rune(res.Result)[:pageResultLimit]) + "\n…"
		}
	}
	if st.CallID != "" {
		if res.EffectIDs, err = opsquery.EffectIDs(ctx, p.db, st.CallID); err != nil {
			return err
		}
	}
	return nil
}

func (p *pageHandler) action(a operate.EffectAction) http.HandlerFunc {
	var fields []string
	if a.TakesOutcome() {
		fields = []string{"outcome"}
	}
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := operate.ParseEffectID(chi.URLParam(r, "id"))
		if err != nil {
			p.redirectFailed(w, r, a.Name(), err)
			return
		}
		form, err := readPageForm(w, r, fields...)
		if err != nil {
			p.redirectFailed(w, r, a.Name(), err)
			return
		}
		outcome := form.Get("outcome")
		res, err := operate.ApplyEffectAction(r.Context(), p.db, a, id, outcome)
		if err != nil {
			p.redirectFailed(w, r, a.Name(), err)
			return
		}
		p.logger.Info("operator page action", "action", a.Name(), "outcome", outcome, "effect", id,
			"from", res.PreviousState, "to", res.Effect.State, "remote", r.RemoteAddr, "by", operatorOf(r))
		msg := fmt.Sprintf("Effect %d (%s %s to %s): %s, now %s.", id, res.Effect.Method, operate.Shorten(res.Effect.Path, 60),
			operate.Shorten(res.Effect.Destination, 40), res.PreviousState, res.Effect.State)
		if res.Warning != "" {
			p.logger.Warn(res.Warning, "effect", id)
			msg += " Warning: " + res.Warning + "."
		}
		p.redirectFlash(w, r, flashDone, msg)
	}
}

func (p *pageHandler) retryDead(w http.ResponseWriter, r *http.Request) {
	if _, err := readPageForm(w, r); err != nil {
		p.redirectFailed(w, r, "retry-dead", err)
		return
	}
	n, err := admin.RetryDead(r.Context(), p.db)
	if err != nil {
		p.redirectFailed(w, r, "retry-dead", err)
		return
	}
	p.logger.Info("operator page action", "action", "retry-dead", "retried", n, "remote", r.RemoteAddr, "by", operatorOf(r))
	p.redirectFlash(w, r, flashDone, fmt.Sprintf("Retried %d dead effects: they are pending, due now.", n))
}

func (p *pageHandler) redirectFailed(w http.ResponseWriter, r *http.Request, action string, err error) {
	if !refusal(err) {
		id := logFault(r.Context(), p.logger, "operator page action failed", err, "action", action)
		p.redirectFlash(w, r, flashFailed, fmt.Sprintf("%s failed: %s.", action, faultText(id)))
		return
	}
	p.redirectFlash(w, r, flashFailed, fmt.Sprintf("%s refused: %v", action, err))
}
