package operator

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/errid"
	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// An operator request can fail two ways. The layer refuses it (a bad
// input, no such effect, an effect in the wrong state): the answer says
// why, in the layer's words, and the operator fixes the request. Or the
// server fails under it (the database busy, gone or full): the error's
// text is then the driver's ("database is locked (5) (SQLITE_BUSY)", a
// PostgreSQL host name), which no answer repeats, as no tool result does
// (issue 36). The answer says it failed and gives an error id; the log has
// the full error under that id at level ERROR, for the operator to find.

// refusal reports whether err is the layer's own refusal of the request,
// whose text is its answer; anything else is a fault (logFault).
func refusal(err error) bool {
	var known *operate.StateError
	return errors.As(err, new(operate.BadInput)) || errors.As(err, &known) || errors.As(err, new(*http.MaxBytesError)) ||
		errors.Is(err, admin.ErrNoEffect) || errors.Is(err, admin.ErrNoCall) || errors.Is(err, admin.ErrNoPending) ||
		errors.Is(err, admin.ErrEffectState) || errors.Is(err, admin.ErrNotResolvable) || errors.Is(err, admin.ErrCallNotUnknown) ||
		errors.Is(err, admin.ErrEffectErased) || errors.Is(err, admin.ErrSealerNeeded)
}

// logFault logs err at ERROR under a new error id, with attrs, and
// returns the id.
func logFault(ctx context.Context, logger *slog.Logger, msg string, err error, attrs ...any) string {
	id := errid.New()
	logger.ErrorContext(ctx, msg, append([]any{"error_id", id, "error", err}, attrs...)...)
	return id
}

// faultText is what an operator is told of a fault logged under id.
func faultText(id string) string {
	return "the server failed to carry out the request (error id " + id + "; the server's log has the error under error_id=" + id + ")"
}

// databaseAway reports whether err says the database is out of reach for
// now: it cannot be reached (schema.DB.Unavailable), or another
// connection's lock outlasted the wait (SQLite's SQLITE_BUSY or
// SQLITE_LOCKED; PostgreSQL's lock_not_available), or the request's time
// ran out. Trying again later may succeed; other faults need a look.
func databaseAway(db *schema.DB, err error) bool {
	if db.Unavailable(err) || errors.Is(err, context.DeadlineExceeded) || pgcode.Of(err) == pgcode.LockNotAvailable {
		return true
	}
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	return errors.As(err, &e) && (e.Code()&0xff == 5 || e.Code()&0xff == 6)
}

// retryAfterAway is the Retry-After, in seconds, of an answer for a
// database out of reach: SQLite's busy wait is 5 s.
const retryAfterAway = "5"

// awayText is what an operator is told when databaseAway.
func awayText(id string) string {
	return "the database is out of reach for now (held by another connection, or not answering); try again shortly (error id " + id + "; the server's log has the error under error_id=" + id + ")"
}
