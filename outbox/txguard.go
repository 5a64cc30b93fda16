package outbox

import (
	"errors"
	"fmt"

	"github.com/mcp-outbox/mcp-outbox/internal/pgcode"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The statement guard.
//
// A handler's statements run inside a transaction the layer begins and
// commits, shared on SQLite with other calls (group commit). A statement
// that ends or controls that transaction (COMMIT, ROLLBACK, SAVEPOINT…),
// or that changes the connection under it (ATTACH, SET, a PRAGMA that
// writes), would commit a call's rows without its outcome, or other calls'
// half-done work, or commit the outcome without durability. So every
// statement text a handler sends through Tx is split into its statements
// the way the database splits it, and refused, before anything runs, if
// one of them is such a statement.
//
// The split follows each database's own tokenizer where it matters: a
// string, a quoted identifier, a comment or a dollar-quoted body hides a
// semicolon and a keyword only where the database hides them too, and
// where the two might disagree the guard sees more statements, never fewer
// (it refuses a harmless text rather than run a hidden COMMIT). The fuzz
// test checks that on SQLite against the database itself.

// ErrStatementRefused is wrapped by the error of a statement a handler may
// not run in the call's transaction; see [Tx].
var ErrStatementRefused = errors.New("statement refused")

// ErrReadOnly is wrapped by the error of a statement that writes in the
// transaction of a tool annotated readOnlyHint: that transaction is
// read-only (BEGIN READ ONLY on PostgreSQL, PRAGMA query_only on SQLite)
// because the layer never commits it, so a write would vanish while the
// handler reported it done. The call then records nothing, whatever the
// handler answers.
var ErrReadOnly = errors.New("write in a read-only tool")

// readOnlyError is a read-only tool's write, refused by the database.
type readOnlyError struct {
	tool string
	stmt string // an excerpt
	err  error  // the database's refusal
}

func (e *readOnlyError) Error() string {
	return fmt.Sprintf("outbox: statement %q refused: tool %q is annotated readOnlyHint, so it runs in a read-only "+
		"transaction that is never committed; a tool that writes must not be annotated readOnlyHint (%v)", e.stmt, e.tool, e.err)
}

func (e *readOnlyError) Unwrap() []error { return []error{ErrReadOnly, e.err} }

// isReadOnlyRefusal reports whether err is the database refusing a write
// in a read-only transaction: SQLITE_READONLY, which query_only gives (a
// read-only file gives it too, and refuses the write all the same), or
// PostgreSQL's read_only_sql_transaction.
func isReadOnlyRefusal(d schema.Dialect, err error) bool {
	if d == schema.Postgres {
		return pgcode.Of(err) == "25006"
	}
	var e interface{ Code() int } // modernc.org/sqlite's *Error
	return errors.As(err, &e) && e.Code()&0xff == 8
}

// refusedError names the refused statement and says why.
type refusedError struct {
	stmt string // an excerpt of the refused statement
	why  string
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("outbox: statement %q refused: %s", e.stmt, e.why)
}

func (e *refusedError) Unwrap() error { return ErrStatementRefused }

const (
	whyTx = "it controls the transaction, which the layer owns: a call's writes, effects and outcome " +
		"commit together when the handler returns, or not at all. Return an error to roll the call's work back; " +
		"put work that must happen anyway in an effect, or do it outside the handler"
	whyConn = "it changes the database connection or session, which other calls share; " +
		"configure it when opening the database, or do it outside the handler"
	whyPragma  = "a PRAGMA may write or change durability; only these read-only pragmas run in a handler: " + readOnlyPragmaList
	whySetting = "it changes a setting of the transaction or session, which other calls share " +
		"(for example synchronous_commit, the call's durability); read settings with SHOW or current_setting"
	whyAtomic = "it ends a statement of its own in a shared transaction; PostgreSQL's BEGIN ATOMIC function bodies " +
		"are not split here: use a $$-quoted body, or create the function in a migration"
)

// refusedFirst maps the first keyword of a statement to why it is refused.
// BEGIN, START, COMMIT, END, ROLLBACK, ABORT, SAVEPOINT, RELEASE and PREPARE
// (PREPARE TRANSACTION, and SQL-level PREPARE, which lives on in the
// pooled connection after the transaction) cover every form of transaction
// control of both databases: COMMIT PREPARED, ROLLBACK TO, START
// TRANSACTION, END TRANSACTION. LISTEN outlives the transaction on the
// pooled connection, and DEALLOCATE can drop the driver's own cached
// statements. NOTIFY stays allowed: it is delivered at commit, with the call.
var refusedFirst = map[string]string{
	"begin": whyTx, "start": whyTx, "commit": whyTx, "end": whyTx, "rollback": whyTx, "abort": whyTx,
	"savepoint": whyTx, "release": whyTx, "prepare": whyTx,
	"attach": whyConn, "detach": whyConn, "vacuum": whyConn, "set": whyConn, "reset": whyConn,
	"discard": whyConn, "listen": whyConn, "unlisten": whyConn, "deallocate": whyConn, "load": whyConn,
}

// readOnlyPragmas are the SQLite pragmas a handler may run, in any form:
// each only reads the schema or checks the database. Every other pragma is
// refused, those that read a setting too: several that look like reads act
// (wal_checkpoint checkpoints, optimize analyzes), and the settings that
// matter here (synchronous, journal_mode, foreign_keys) are the layer's.
var readOnlyPragmas = map[string]bool{
	"table_info": true, "table_xinfo": true, "table_list": true,
	"index_list": true, "index_info": true, "index_xinfo": true,
	"foreign_key_list": true, "foreign_key_check": true,
	"integrity_check": true, "quick_check": true,
	"collation_list": true, "function_list": true, "module_list": true, "pragma_list": true,
	"database_list": true, "compile_options": true,
}

const readOnlyPragmaList = "table_info, table_xinfo, table_list, index_list, index_info, index_xinfo, " +
	"foreign_key_list, foreign_key_check, integrity_check, quick_check, collation_list, function_list, " +
	"module_list, pragma_list, database_list, compile_options"

// checkStatements returns a *refusedError for the first statement of q a
// handler may not run, or nil.
func checkStatements(d schema.Dialect, q string) error {
	if d != schema.Postgres {
		return scanStatements(q, lexSQLite)
	}
	// A PostgreSQL server reads backslashes in '...' strings as escapes
	// when standard_conforming_strings is off (the default before 9.1,
	// still settable per database), so the same text splits differently.
	// The guard cannot know the server's setting: it refuses what either
	// reading reveals.
	if err := scanStatements(q, lexPostgres); err != nil {
		return err
	}
	return scanStatements(q, lexPostgresBackslash)
}
