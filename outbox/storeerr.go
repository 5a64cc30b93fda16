package outbox

import (
	"errors"

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// storeFailed reports whether err is SQLite saying that the database
// failed, not the statement: by the result code, not the text. The texts
// differ from the code names ("database or disk is full (13)" for
// SQLITE_FULL, "attempt to write a readonly database (8)"), so matching
// text let a full or read-only database reach a handler as an ordinary
// error, which the call then recorded as its failed outcome and replayed
// for the key's lifetime. These codes may also have rolled back the whole
// transaction, so the handler must not go on in it.
//
// On PostgreSQL the store failed when the server cannot be reached or
// refuses work for want of resources, which only the client library's
// errors tell: db asks its store (schema.DB.Unavailable).
func storeFailed(db *schema.DB, err error) bool {
	if db.Unavailable(err) {
		return true
	}
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() & 0xff { // the primary code; extended codes add bits above
	case 5, // SQLITE_BUSY
		6,  // SQLITE_LOCKED
		7,  // SQLITE_NOMEM
		8,  // SQLITE_READONLY
		9,  // SQLITE_INTERRUPT
		10, // SQLITE_IOERR
		11, // SQLITE_CORRUPT
		13, // SQLITE_FULL
		14, // SQLITE_CANTOPEN
		15, // SQLITE_PROTOCOL
		26: // SQLITE_NOTADB
		return true
	}
	return false
}

// isBusy reports whether err is SQLite's SQLITE_BUSY (or one of its extended
// codes): another connection holds the lock the statement needed for longer
// than it may wait. Within one layer every write goes through the one writer
// connection, whose turns are taken in order, so the other connection is
// another process (or another handle on the same file).
//
// On PostgreSQL the counterpart is a claim that waited for a row lock until
// its lock_timeout (another attempt's transaction holds the call's row), or
// that lost to a deadlock or a serialization failure.
func isBusy(err error) bool {
	switch pgcode.Of(err) {
	case pgcode.LockNotAvailable, pgcode.DeadlockDetected, pgcode.SerializationFailure:
		return true
	}
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	return errors.As(err, &e) && e.Code()&0xff == sqliteBusy
}

// sqliteBusy is SQLite's primary result code SQLITE_BUSY.
const sqliteBusy = 5

// storeCondition names, in the layer's words, the state of the database
// that err reports, or "" if it is not one the layer knows. A client is
// told this, never the driver's text, which may name the server, its
// user, tables and values.
func storeCondition(db *schema.DB, err error) string {
	if db != nil && db.Unavailable(err) {
		return "the database could not be reached"
	}
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	if !errors.As(err, &e) {
		return ""
	}
	switch e.Code() & 0xff {
	case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
		return "the database was locked by another connection"
	case 8: // SQLITE_READONLY
		return "the database is read-only"
	case 10: // SQLITE_IOERR
		return "the database met an I/O error"
	case 11, 26: // SQLITE_CORRUPT, SQLITE_NOTADB
		return "the database file is damaged"
	case 13: // SQLITE_FULL
		return "the database is full"
	}
	return ""
}

// withCondition is " (cond)" for a known condition of the database, or "".
func withCondition(db *schema.DB, err error) string {
	if c := storeCondition(db, err); c != "" {
		return " (" + c + ")"
	}
	return ""
}
