package operator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Unknown calls on the operator page: calls forwarded to a tool server
// whose work is outside the call's transaction, whose outcome was lost
// (outbox/doc.go). The page lists the newest (operate.PageUnknownCalls) and settles one at a time, as
// `mcp-outbox outbox resolve-call` and POST /admin/calls/resolve do.
//
//	POST /calls/{id}/resolve        form fields outcome (completed, failed or
//	                                rerun) and note (optional)
//
// A call is addressed by its row id (calls.id), never by its key: a form's
// action ends up in the browser's history and in proxies' logs, and the
// flash message after it in the redirect's URL, which this project keeps
// keys out of. Row ids are never handed out twice (AUTOINCREMENT), so an id
// names one call for good: after a rerun deletes it, the next call with
// the same key has another id.

// pageUnknownCall is a row of the page's list of unknown calls. It holds
// the raw key for the template's keyHash; the page never prints it.
type pageUnknownCall struct {
	ID        int64
	UID       string // calls.uid: the "call id" of the lookup, the API and the CLI
	Principal string
	Key       string
	KeySource string
	Tool      string
	Attempts  int
	CreatedAt time.Time
	// UnknownAt is when the call became unknown: the attempt that lost the
	// answer records it; a claim found abandoned later (by the retention
	// sweep) leaves it unrecorded, the zero time.
	UnknownAt time.Time
}

// selectPageUnknownCalls is opsquery.ListUnknownCalls newest first, with the
// row id and the time the call became unknown. It reads the calls_unknown
// index backwards.
const selectPageUnknownCalls = `
SELECT id, uid, principal, key, key_source, tool, attempts, created_at, completed_at
FROM calls WHERE state = 'unknown'
ORDER BY created_at DESC, id DESC
LIMIT $1`

func listPageUnknownCalls(ctx context.Context, db *sql.DB, limit int) ([]pageUnknownCall, error) {
	rows, err := db.QueryContext(ctx, selectPageUnknownCalls, limit)
	if err != nil {
		return nil, fmt.Errorf("list unknown calls: %w", err)
	}
	defer rows.Close()
	var out []pageUnknownCall
	for rows.Next() {
		var (
			c        pageUnknownCall
			created  int64
			unknowns sql.NullInt64
		)
		if err := rows.Scan(&c.ID, &c.UID, &c.Principal, &c.Key, &c.KeySource, &c.Tool, &c.Attempts, &created, &unknowns); err != nil {
			return nil, fmt.Errorf("list unknown calls: %w", err)
		}
		c.CreatedAt = time.UnixMilli(created).UTC()
		if unknowns.Valid {
			c.UnknownAt = time.UnixMilli(unknowns.Int64).UTC()
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list unknown calls: %w", err)
	}
	return out, nil
}

func parseCallID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, operate.BadInputf("call id %q: want a positive integer", operate.Shorten(s, 40))
	}
	return id, nil
}

// pageCallRef is what the page knows of the call a form addresses.
type pageCallRef struct {
	Principal, Key, UID, Tool, State string
}

// readPageCall reads call id, saying by id, never by key, when there is no
// such call.
func readPageCall(ctx context.Context, db *schema.DB, id int64) (*pageCallRef, error) {
	var c pageCallRef
	err := db.Read.QueryRowContext(ctx, `SELECT principal, key, uid, tool, state FROM calls WHERE id = $1`, id).
		Scan(&c.Principal, &c.Key, &c.UID, &c.Tool, &c.State)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("call %d: %w (settled and forgotten, or purged)", id, admin.ErrNoCall)
	}
	if err != nil {
		return nil, fmt.Errorf("read call %d: %w", id, err)
	}
	return &c, nil
}

// resolveCall settles an unknown call by its row id: the page's form for
// resolve-call.
func (p *pageHandler) resolveCall(w http.ResponseWriter, r *http.Request) {
	const action = "settle"
	id, err := parseCallID(chi.URLParam(r, "id"))
	if err != nil {
		p.redirectFailed(w, r, action, err)
		return
	}
	form, err := readPageForm(w, r, "outcome", "note")
	if err != nil {
		p.redirectFailed(w, r, action, err)
		return
	}
	outcome, note := form.Get("outcome"), strings.TrimSpace(form.Get("note"))
	// The outcome first, so that a bad one is refused whatever the call.
	if !slices.Contains(operate.CallOutcomeNames(), outcome) {
		p.redirectFailed(w, r, action, operate.BadInputf("outcome %q: want %s", operate.Shorten(outcome, 40), operate.OrList(operate.CallOutcomeNames())))
		return
	}
	call, err := readPageCall(r.Context(), p.db, id)
	if err != nil {
		p.redirectFailed(w, r, action, err)
		return
	}
	name := fmt.Sprintf("Call %d (%s of %s, key %s)", id, operate.Shorten(call.Tool, 40), operate.Shorten(call.Principal, 60), operate.KeyHash(call.Principal, call.Key))
	if call.State != string(query.OutcomeUnknown) {
		p.redirectFailed(w, r, action, fmt.Errorf("%s is %s: %w", name, call.State, admin.ErrCallNotUnknown))
		return
	}
	// By uid, never reused: if this call was settled as rerun meanwhile
	// and a new call with its key became unknown, that one is not touched.
	if err := operate.CheckResolveCall(operate.CallRef{CallID: call.UID}, outcome, note); err != nil {
		p.redirectFailed(w, r, action, err)
		return
	}
	if err := admin.ResolveCallUID(r.Context(), p.db, call.UID, admin.Resolution{Outcome: admin.CallOutcome(outcome), Note: note, Sealer: p.sealer}); err != nil {
		if errors.Is(err, admin.ErrNoCall) || errors.Is(err, admin.ErrCallNotUnknown) {
			err = fmt.Errorf("%s was settled meanwhile: %w", name, err)
		}
		p.redirectFailed(w, r, action, err)
		return
	}
	state := outcome
	if outcome == string(admin.CallRerun) {
		state = string(query.NotFound)
	}
	p.logger.Info("operator page action", "action", "resolve-call", "outcome", outcome, "call", id, "call_id", call.UID,
		"key", callkey.KeyHash(call.Principal, call.Key), "tool", call.Tool, "from", query.OutcomeUnknown, "to", state, "remote", r.RemoteAddr, "by", operatorOf(r))
	msg := name + ": was unknown, now " + state + "."
	if outcome == string(admin.CallRerun) {
		msg = name + ": was unknown, now forgotten: the next retry with its key runs it."
		if note != "" {
			msg += " The note was not recorded: rerun records no result."
		}
	}
	p.redirectFlash(w, r, flashDone, msg)
}
