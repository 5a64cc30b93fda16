package outbox

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/query"
)

// The status tool tells a client what happened to each effect of its call,
// in the layer's words. The effect's recorded last_error is the operator's:
// the dispatcher writes what the transport said ("request not sent: dial
// tcp 10.0.3.7:8443: connect: connection refused"), which names internal
// hosts, addresses and ports, and a destination's own text may follow. A
// client gets a class instead (not sent, sent without an answer, the
// destination's HTTP status) and what comes next; the full error stays on
// the operator's side: the admin API, the page, `mcp-outbox outbox` and
// `mcp-outbox status`, which read the database and show it as stored.

// clientNotes are last_error texts the layer writes itself, with no host,
// address or foreign text in them: the operators' actions (internal/admin)
// and the dispatcher's reclaim of an interrupted attempt (outbox/dispatch).
// Passed on as they are.
var clientNotes = map[string]bool{
	"retry requested by an operator":                        true,
	"cancelled by an operator":                              true,
	"resolved as not applied by an operator; sending again": true,
	"resolved as delivered by an operator":                  true,
	"cancelled: its principal was forgotten":                true,
	"delivery interrupted after the request was sent; the destination cannot dedup, so it is not re-sent":   true,
	"delivery interrupted (dispatcher stopped or lost its lease); will retry with the same Idempotency-Key": true,
	"resolved by probe: the destination has it":                                                             true,
	"resolved by probe: the destination never got it; sending again":                                        true,
}

// forClient rewrites st's effects' lastError for the client asking.
func forClient(st *query.Status) {
	for i := range st.Effects {
		st.Effects[i].LastError = clientEffectNote(st.Effects[i])
	}
}

// clientEffectNote says what happened to e: what its last attempt met
// (clientAttemptNote) and what comes next, by its state. Empty for an
// effect delivered without trouble, as lastError was.
func clientEffectNote(e query.EffectStatus) string {
	if clientNotes[e.LastError] {
		return e.LastError
	}
	what := clientAttemptNote(e)
	switch e.State {
	case "pending":
		if e.Attempts == 0 && what == "" {
			return "not sent yet"
		}
		if what == "" {
			what = "not delivered yet"
		}
		if e.NextAttemptAt != nil {
			return fmt.Sprintf("%s; will retry at %s", what, e.NextAttemptAt.UTC().Format(time.RFC3339))
		}
		return what + "; will retry"
	case "in_flight":
		return "being sent now"
	case "dead":
		if what == "" {
			what = "not delivered"
		}
		return what + "; given up: it is not sent again unless an operator retries it"
	case "unknown":
		if what == "" {
			what = "sent, but no answer came back"
		}
		return what + "; whether the destination applied it is unknown, so it is not sent again: an operator settles it"
	case "delivered":
		return ""
	case "cancelled":
		return "cancelled"
	}
	return what
}

// clientAttemptNote classifies the last attempt of e: the destination's
// status code when it answered, else whether the request left, read from
// the dispatcher's own prefixes (outbox/dispatch, send.go), else nothing.
// Whatever follows a prefix is the transport's or the destination's text
// and is never passed on.
func clientAttemptNote(e query.EffectStatus) string {
	if e.LastStatus != 0 && e.State != "delivered" {
		if s := e.LastStatus; s >= 400 && s < 500 && !retriedStatus(s) {
			return fmt.Sprintf("the destination refused it (HTTP %d)", s)
		}
		return fmt.Sprintf("the destination answered HTTP %d", e.LastStatus)
	}
	msg := e.LastError
	if _, rest, ok := strings.Cut(msg, " attempts: "); ok && strings.HasPrefix(msg, "gave up after ") {
		msg = rest
	}
	switch {
	case msg == "":
		return ""
	case strings.HasPrefix(msg, "no response after the request was sent"):
		return "sent, but no answer came back"
	case strings.HasPrefix(msg, "request not sent"):
		return "not sent: the destination could not be reached"
	case strings.HasPrefix(msg, "not sent"):
		return "not sent: its request could not be read (sealed with a key this server lacks, or tampered with)"
	case strings.HasPrefix(msg, "probe "):
		return "sent, but no answer came back, and the destination could not yet say whether it has it"
	case strings.HasPrefix(msg, "gave up: effect is"):
		return "not sent: it grew older than its destination allows"
	}
	return "the last attempt failed"
}

// retriedStatus is true of the 4xx answers the dispatcher retries
// (classify in outbox/dispatch): they say "later", not "no".
func retriedStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusConflict || code == http.StatusTooEarly ||
		code == http.StatusTooManyRequests
}
