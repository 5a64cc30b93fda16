package operate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/internal/visible"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The operator actions on effects and unknown calls, shared by the admin
// API, the page and the command line (cmd/mcp-outbox's outbox command),
// so that all three accept and refuse exactly the same things.

// effectStates are the states of an effect and what each means to an
// operator. Validation and help text both come from this list.
var effectStates = glossary{
	{"pending", "waiting for its next attempt: new, or retrying after a failure"},
	{"in_flight", "a dispatcher holds it under a lease and an attempt is under way; no\noperator action applies. If that dispatcher died, the next serve or\ndrain takes it back (at once on this host, else when the lease passes)"},
	{"delivered", "the destination answered 2xx (or a probe or an operator said it has it)"},
	{"dead", "given up: the destination refused it (any answer but 2xx, 408, 409,\n425, 429 or 5xx), or max_attempts or max_age was reached"},
	{"unknown", "at an at_most_once destination, a request left and no answer came:\nit may or may not have been applied, so it is never sent again by\nitself; a probe or an operator settles it"},
	{"cancelled", "stopped by an operator; it will not be delivered"},
}

// glossary is a list of names, each with what it means to an operator;
// validation and help text both come from it.
type glossary []struct{ name, meaning string }

func (g glossary) names() []string {
	names := make([]string, len(g))
	for i, e := range g {
		names[i] = e.name
	}
	return names
}

// help lists the names with their meanings, a continuation line indented
// under its meaning.
func (g glossary) help() string {
	var b strings.Builder
	for _, e := range g {
		lines := strings.Split(e.meaning, "\n")
		fmt.Fprintf(&b, "  %-10s %s\n", e.name, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(&b, "  %-10s %s\n", "", l)
		}
	}
	return b.String()
}

// EffectStateNames are the states of an effect.
func EffectStateNames() []string { return effectStates.names() }

// EffectStatesHelp lists the states of an effect with what each means.
func EffectStatesHelp() string { return effectStates.help() }

// BadInput is a request the operator got wrong: a usage error on the
// command line, 400 from the API.
type BadInput struct{ Err error }

func (b BadInput) Error() string { return b.Err.Error() }
func (b BadInput) Unwrap() error { return b.Err }

// BadInputf returns a BadInput with a formatted message.
func BadInputf(format string, args ...any) error { return BadInput{fmt.Errorf(format, args...)} }

// Bounds of a listing. The upper bound keeps an API response (each row
// may carry a recorded response of a few KiB) to a sane size.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ParseEffectFilter validates a listing's filters.
func ParseEffectFilter(state, dest string, limit int) (opsquery.EffectFilter, error) {
	if state != "" && !slices.Contains(EffectStateNames(), state) {
		return opsquery.EffectFilter{}, BadInputf("state %q: want one of %s", state, strings.Join(EffectStateNames(), ", "))
	}
	if limit < 1 || limit > MaxListLimit {
		return opsquery.EffectFilter{}, BadInputf("limit %d: want 1 to %d", limit, MaxListLimit)
	}
	return opsquery.EffectFilter{State: state, Destination: dest, Limit: limit}, nil
}

// ParseEffectID reads an effect id from the command line or a URL.
func ParseEffectID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, BadInputf("effect id %q: want a positive integer", s)
	}
	return id, nil
}

// Outcomes an operator can resolve an effect to.
const (
	outcomeDelivered = "delivered"
	outcomeRetry     = "retry"
)

// EffectAction is an operator action on one effect.
type EffectAction struct {
	name string
	// from lists the states the action applies to. The library's
	// statements are the authority; TestEffectActionStates checks that this
	// list says the same, since help and errors quote it.
	from []string
	// outcome is set for resolve, which takes delivered or retry.
	outcome bool
	run     func(ctx context.Context, db *schema.DB, id int64, outcome string) error
}

var EffectActions = []EffectAction{
	{
		name: "retry",
		from: []string{"dead", "unknown", "pending", "cancelled"},
		run: func(ctx context.Context, db *schema.DB, id int64, _ string) error {
			return admin.RetryEffect(ctx, db, id)
		},
	},
	{
		name: "cancel",
		from: []string{"pending", "dead", "unknown"},
		run: func(ctx context.Context, db *schema.DB, id int64, _ string) error {
			return admin.CancelEffect(ctx, db, id)
		},
	},
	{
		name:    "resolve",
		from:    []string{"unknown", "dead"},
		outcome: true,
		run: func(ctx context.Context, db *schema.DB, id int64, outcome string) error {
			return admin.ResolveEffect(ctx, db, id, admin.EffectOutcome(outcome))
		},
	},
}

// Name is the action's name: retry, cancel or resolve.
func (a EffectAction) Name() string { return a.name }

// TakesOutcome reports whether the action takes an outcome (resolve does).
func (a EffectAction) TakesOutcome() bool { return a.outcome }

// From lists the states of an effect the action applies to.
func (a EffectAction) From() []string { return slices.Clone(a.from) }

// CheckOutcome validates resolve's outcome; other actions take none.
func (a EffectAction) CheckOutcome(outcome string) error {
	switch {
	case !a.outcome && outcome != "":
		return BadInputf("%s takes no outcome", a.name)
	case a.outcome && outcome != outcomeDelivered && outcome != outcomeRetry:
		return BadInputf("outcome %q: want %s (the destination has it) or %s (it does not; send it again)",
			outcome, outcomeDelivered, outcomeRetry)
	}
	return nil
}

// FindEffectAction returns the action of that name.
func FindEffectAction(name string) (EffectAction, bool) {
	for _, a := range EffectActions {
		if a.name == name {
			return a, true
		}
	}
	return EffectAction{}, false
}

// ActionResult is what an action did, for the command line and the API.
type ActionResult struct {
	Effect        opsquery.EffectRow `json:"effect"`
	PreviousState string             `json:"previousState"`
	Warning       string             `json:"warning,omitempty"`
}

// ApplyEffectAction validates and runs an action on effect id.
func ApplyEffectAction(ctx context.Context, db *schema.DB, a EffectAction, id int64, outcome string) (*ActionResult, error) {
	if err := a.CheckOutcome(outcome); err != nil {
		return nil, err
	}
	before, err := ReadEffect(ctx, db, id)
	if err != nil {
		return nil, err
	}
	// ResolveEffect with retry is RetryEffect, which also takes pending and
	// cancelled effects; resolving either would be a mistake (un-cancelling
	// one, for instance), so resolve keeps to its own states here. The check
	// reads before it writes, but RetryEffect's own statement still never
	// touches an effect in flight.
	if a.outcome && !slices.Contains(a.from, before.State) {
		return nil, newStateError(a, id, before.State, admin.ErrNotResolvable)
	}
	if err := a.run(ctx, db, id, outcome); err != nil {
		if errors.Is(err, admin.ErrEffectState) || errors.Is(err, admin.ErrNotResolvable) {
			now, rerr := ReadEffect(ctx, db, id)
			if rerr != nil {
				return nil, rerr
			}
			return nil, newStateError(a, id, now.State, admin.ErrEffectState)
		}
		return nil, err
	}
	after, err := ReadEffect(ctx, db, id)
	if err != nil {
		return nil, err
	}
	res := &ActionResult{Effect: *after, PreviousState: before.State}
	if before.State == "unknown" && after.State == "pending" {
		// Only at_most_once destinations make effects unknown.
		res.Warning = fmt.Sprintf("effect %d was unknown and will be sent again; its destination cannot dedup, "+
			"so if it applied the first request it applies this one too", id)
	}
	return res, nil
}

// StateError says what the effect's state is and what the action needs;
// it matches the library's sentinel without repeating its text.
type StateError struct {
	msg      string
	sentinel error
}

func (e *StateError) Error() string { return e.msg }
func (e *StateError) Unwrap() error { return e.sentinel }

func newStateError(a EffectAction, id int64, state string, sentinel error) error {
	return &StateError{fmt.Sprintf("effect %d is %s; %s applies only to %s effects", id, state, a.name, OrList(a.from)), sentinel}
}

// ReadEffect reads effect id, ErrNoEffect when there is none.
func ReadEffect(ctx context.Context, db *schema.DB, id int64) (*opsquery.EffectRow, error) {
	rows, err := opsquery.ListEffects(ctx, db, opsquery.EffectFilter{ID: id, Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("read effect %d: %w", id, err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("effect %d: %w", id, admin.ErrNoEffect)
	}
	return &rows[0], nil
}

// EffectSummary is the count of effects by state, with the total, and
// the number of calls in state unknown: the other thing that waits for an
// operator.
type EffectSummary struct {
	opsquery.Counts
	Total        int `json:"total"`
	UnknownCalls int `json:"unknownCalls"`
}

// SummarizeEffects counts effects by state, and the unknown calls.
func SummarizeEffects(ctx context.Context, db *schema.DB) (EffectSummary, error) {
	c, err := opsquery.CountEffects(ctx, db)
	if err != nil {
		return EffectSummary{}, err
	}
	n, err := opsquery.CountUnknownCalls(ctx, db)
	if err != nil {
		return EffectSummary{}, err
	}
	return EffectSummary{Counts: c, Total: c.Total(), UnknownCalls: n}, nil
}

// Unknown calls: a call forwarded to a tool server whose work is outside
// the call's transaction (mcp-outbox proxy), whose outcome was lost. It may
// or may not have run; an operator finds out and settles it.

// callOutcomes are the outcomes an operator can resolve an unknown call to,
// and what each means. Validation and help text both come from this list.
var callOutcomes = glossary{
	{string(admin.CallCompleted), "it ran and its work is done: record it as completed; a retry\nreplays the note as its result"},
	{string(admin.CallFailed), "it ran and failed, or must not run: record it as failed; a retry\nreplays the note as a tool error"},
	{string(admin.CallRerun), "it did not run: forget it, so that the next retry with its key\nruns it"},
}

// CallOutcomeNames are the outcomes an operator can settle a call to.
func CallOutcomeNames() []string { return callOutcomes.names() }

// CallOutcomesHelp lists the outcomes with what each means.
func CallOutcomesHelp() string { return callOutcomes.help() }

// maxNoteBytes bounds an operator's note: it becomes the text of the
// call's recorded result, which every retry replays to the client.
const maxNoteBytes = 1000

// CallResolution is what resolving an unknown call did, for the command
// line and the API.
type CallResolution struct {
	Principal     string      `json:"principal"`
	Key           string      `json:"key"`
	Tool          string      `json:"tool"`
	CallID        string      `json:"callId"`
	Outcome       string      `json:"outcome"`
	PreviousState query.State `json:"previousState"`
	// State is the call's state now: completed, failed, or not_found for
	// rerun (the call is forgotten; the next retry runs it).
	State query.State `json:"state"`
}

// CallRef names the call a resolution is for: by principal and key, or by
// its call id (calls.uid, which the status tool, the logs and the page show
// and which is never reused).
type CallRef struct {
	Principal, Key string
	CallID         string
}

// CheckResolveCall validates a resolution before anything is opened.
func CheckResolveCall(ref CallRef, outcome, note string) error {
	switch {
	case ref.CallID != "" && ref.Key != "":
		return BadInputf("give the call's key or its call id, not both")
	case ref.CallID != "":
		if len(ref.CallID) > 64 || strings.ContainsFunc(ref.CallID, func(r rune) bool { return r <= ' ' || r > '~' }) {
			return BadInputf("call id %q: want the callId the status tool shows, such as call_0123abcd", Shorten(ref.CallID, 40))
		}
	default:
		if ref.Principal == "" {
			return BadInputf("principal: empty")
		}
		if err := callkey.Validate(ref.Key); err != nil {
			return BadInputf("key: %v", err)
		}
	}
	if !slices.Contains(CallOutcomeNames(), outcome) {
		return BadInputf("outcome %q: want %s", outcome, OrList(CallOutcomeNames()))
	}
	if len(note) > maxNoteBytes {
		return BadInputf("note: %d bytes, the limit is %d", len(note), maxNoteBytes)
	}
	return nil
}

// ResolveUnknownCall validates and settles the unknown call ref names. s
// is the Sealer of the database's key file, nil for a database without
// one: the note is recorded as the call's result (admin.ResolveCall).
func ResolveUnknownCall(ctx context.Context, db *schema.DB, s *sealing.Sealer, ref CallRef, outcome, note string) (*CallResolution, error) {
	if err := CheckResolveCall(ref, outcome, note); err != nil {
		return nil, err
	}
	res := &CallResolution{Principal: ref.Principal, Key: ref.Key, CallID: ref.CallID, Outcome: outcome, PreviousState: query.OutcomeUnknown}
	// For the report only: ResolveCall's own statement applies only to an
	// unknown call, and says what the call is if it is not one.
	var err error
	if ref.CallID != "" {
		err = db.Read.QueryRowContext(ctx, `SELECT tool, principal, key FROM calls WHERE uid = $1`, ref.CallID).
			Scan(&res.Tool, &res.Principal, &res.Key)
	} else {
		err = db.Read.QueryRowContext(ctx, `SELECT tool, uid FROM calls WHERE principal = $1 AND key = $2`, ref.Principal, ref.Key).
			Scan(&res.Tool, &res.CallID)
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("read the call: %w", err)
	}
	if ref.CallID != "" {
		err = admin.ResolveCallUID(ctx, db, ref.CallID, admin.Resolution{Outcome: admin.CallOutcome(outcome), Note: note, Sealer: s})
	} else {
		err = admin.ResolveCall(ctx, db, admin.CallRef{Principal: ref.Principal, Key: ref.Key}, admin.Resolution{Outcome: admin.CallOutcome(outcome), Note: note, Sealer: s})
	}
	if err != nil {
		if errors.Is(err, admin.ErrCallOutcome) {
			return nil, BadInput{Err: err}
		}
		return nil, err
	}
	res.State = query.State(outcome)
	if outcome == string(admin.CallRerun) {
		res.State = query.NotFound
	}
	return res, nil
}

// keyRedacted is an error whose message names a call by its key's hash
// where the error it wraps quoted the raw key (outbox's and
// ResolveUnknownCall's messages say `call "KEY" of PRINCIPAL`).
type keyRedacted struct {
	msg string
	err error
}

func (e *keyRedacted) Error() string { return e.msg }
func (e *keyRedacted) Unwrap() error { return e.err }

// RedactKey names the call in err's message by its key's hash.
func RedactKey(err error, principal, key string) error {
	if err == nil || key == "" {
		return err
	}
	return &keyRedacted{strings.ReplaceAll(err.Error(), strconv.Quote(key), "with key "+KeyHash(principal, key)), err}
}

// OrList joins items as "a, b or c".
func OrList(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// Shorten makes s printable on one line and at most n characters long,
// for tables and pages: a control character becomes a space, a format
// character its code point (visible.Text), so that text from a client
// cannot reorder what an operator reads.
func Shorten(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	s = visible.Text(s)
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// KeyHash is how the page and the logs name a call: callkey.KeyHash of its
// principal and key, never the key itself. A call without a key has none.
func KeyHash(principal, key string) string {
	if key == "" {
		return ""
	}
	return callkey.KeyHash(principal, key)
}
