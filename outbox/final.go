package outbox

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
)

// What a handler returns decides what is recorded (see "What is recorded"
// in the package doc): a result with isError, or an error marked with
// [Final], is the call's outcome; any other error is a fault that leaves
// nothing behind, so that a retry runs the call again.

// finalError is a handler error marked with [Final].
type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }
func (e *finalError) Unwrap() error { return e.err }

// Final marks a handler's error as the call's outcome: a business rejection
// such as "card declined" or "no such invoice", which a retry would only
// repeat. The call is recorded as failed with the error's text, which the
// client reads, and a retry with the same key replays it without running
// the handler. The handler's writes and effects are rolled back, as for
// any failed call. Final(nil) is nil.
//
// Without Final, a handler's error is taken for a fault (a bad statement,
// a bug, a downstream hiccup): nothing is recorded, the client gets a
// generic error naming the call, and the error itself goes to the layer's
// log.
func Final(err error) error {
	if err == nil {
		return nil
	}
	return &finalError{err}
}

func isFinal(err error) bool {
	var f *finalError
	return errors.As(err, &f)
}

// errHandlerFailed stands in, towards the SDK, for a handler's unmarked
// error, so that its text never enters a result; finish answers
// handlerFailed instead.
var errHandlerFailed = errors.New("the tool failed; nothing of the call was kept")

// handlerFailed is the answer of a call whose handler returned an unmarked
// error. It names the call so that an operator can find the error, which
// went to the log, and says nothing of the error itself: its text may be a
// driver's, naming tables, or worse.
func (a *attempt) handlerFailed() *mcp.CallToolResult {
	return toolError(codeNotRecorded, "%s", handlerFailedText(a.uid))
}

func handlerFailedText(uid string) string {
	return fmt.Sprintf("the tool failed, and nothing of this call was kept: a retry runs it again. "+
		"The server's log has the error under call id %s.", uid)
}

// handlerFailedShown is the answer of a call whose handler returned an
// unmarked error that ShowErrors lets the client read.
func (a *attempt) handlerFailedShown(err error) *mcp.CallToolResult {
	return toolError(codeNotRecorded, "%v\n\n(Nothing of this call was kept: a retry runs it again. Call id %s.)", err, a.uid)
}

// showable reports whether a handler's error may reach the client under
// ShowErrors: the handler's own words, not the database's. The database's
// may name tables, columns and values of other principals' rows.
func (a *attempt) showable(err error) bool {
	if a.txErr != nil || a.failedStmt != nil {
		return false // the call's transaction failed: what follows is about that
	}
	for _, r := range a.returned {
		if errors.Is(err, r) {
			return false
		}
	}
	return !fromDatabase(err) && !a.layer.db.Unavailable(err)
}

// fromDatabase reports whether err wraps an error of a database driver or
// of database/sql, which a handler may have got outside its Tx.
func fromDatabase(err error) bool {
	var sqliteErr interface{ Code() int } // modernc.org/sqlite's *Error
	if errors.As(err, &sqliteErr) || pgcode.Of(err) != "" {
		return true
	}
	for _, e := range []error{sql.ErrNoRows, sql.ErrTxDone, sql.ErrConnDone, driver.ErrBadConn, driver.ErrSkip,
		ErrStatementRefused, ErrReadOnly, ErrOwnershipLost} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
