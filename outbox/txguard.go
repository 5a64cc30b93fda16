package outbox

import (
	"errors"
	"fmt"
	"strings"

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
		return schema.PgCode(err) == "25006"
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

type lexMode int

const (
	lexSQLite lexMode = iota
	lexPostgres
	lexPostgresBackslash // standard_conforming_strings off
)

type tokKind int

const (
	tokWord   tokKind = iota // a bare word: keyword or identifier
	tokQuoted                // a quoted identifier (text holds it unquoted)
	tokString                // a string or blob literal, a dollar-quoted body
	tokOther                 // a number, a parameter, an operator or punctuation
	tokSemi
)

type token struct {
	kind       tokKind
	text       string
	start, end int
}

// lexer splits a statement text into tokens, skipping whitespace and
// comments.
type lexer struct {
	s    string
	i    int
	mode lexMode
}

func isSpace(c byte) bool {
	// \v is whitespace to PostgreSQL and an illegal character to SQLite,
	// which then runs nothing: whitespace to the guard either way.
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

// isIdentChar: both databases let identifiers continue with digits and '$'.
func isIdentChar(c byte) bool {
	return isIdentStart(c) || c >= '0' && c <= '9' || c == '$'
}

func (l *lexer) pg() bool { return l.mode != lexSQLite }

// next returns the next token, or false at the end of the text.
func (l *lexer) next() (token, bool) {
	s := l.s
	for l.i < len(s) {
		c := s[l.i]
		switch {
		case isSpace(c):
			l.i++
			continue
		case strings.HasPrefix(s[l.i:], "\xef\xbb\xbf"):
			// A UTF-8 byte order mark is whitespace to SQLite's tokenizer,
			// so "\ufeffCOMMIT" is a COMMIT there.
			l.i += 3
			continue
		case c == '-' && l.i+1 < len(s) && s[l.i+1] == '-':
			l.i += 2
			for l.i < len(s) && s[l.i] != '\n' && !(l.pg() && s[l.i] == '\r') {
				l.i++
			}
			continue
		case c == '/' && l.i+1 < len(s) && s[l.i+1] == '*':
			l.skipBlockComment()
			continue
		}
		break
	}
	if l.i >= len(s) {
		return token{}, false
	}
	start := l.i
	c := s[l.i]
	tok := func(k tokKind, text string) (token, bool) {
		return token{kind: k, text: text, start: start, end: l.i}, true
	}
	switch {
	case c == ';':
		l.i++
		return tok(tokSemi, ";")
	case c == '\'':
		l.quoted('\'', l.mode == lexPostgresBackslash)
		return tok(tokString, "")
	case c == '"' || !l.pg() && c == '`':
		raw := l.quoted(c, false)
		if q := string([]byte{c, c}); strings.Contains(raw, q) {
			raw = strings.ReplaceAll(raw, q, q[:1])
		}
		return tok(tokQuoted, raw)
	case !l.pg() && c == '[':
		// SQLite's [identifier]: no escapes, ends at the first ']'.
		end := strings.IndexByte(s[l.i+1:], ']')
		if end < 0 {
			l.i = len(s)
			return tok(tokQuoted, s[start+1:])
		}
		l.i += end + 2
		return tok(tokQuoted, s[start+1:l.i-1])
	case !l.pg() && (c == '$' || c == '@' || c == ':' || c == '#'):
		l.sqliteVariable()
		return tok(tokOther, "")
	case l.pg() && c == '$':
		if l.dollarQuote() {
			return tok(tokString, "")
		}
		l.i++
		for l.i < len(s) && s[l.i] >= '0' && s[l.i] <= '9' {
			l.i++
		}
		return tok(tokOther, "")
	case c >= '0' && c <= '9' || c == '.' && l.i+1 < len(s) && s[l.i+1] >= '0' && s[l.i+1] <= '9':
		// A number. It never takes a quote, a '$' or a comment in, so
		// what follows it is read as either database reads it.
		for l.i < len(s) && (s[l.i] >= '0' && s[l.i] <= '9' || s[l.i] >= 'a' && s[l.i] <= 'z' ||
			s[l.i] >= 'A' && s[l.i] <= 'Z' || s[l.i] == '_' || s[l.i] == '.') {
			l.i++
		}
		return tok(tokOther, "")
	case isIdentStart(c):
		for l.i < len(s) && isIdentChar(s[l.i]) {
			l.i++
		}
		word := s[start:l.i]
		if l.pg() && (word == "e" || word == "E") && l.i < len(s) && s[l.i] == '\'' {
			// PostgreSQL's E'...' string, where a backslash escapes.
			l.quoted('\'', true)
			return tok(tokString, "")
		}
		return tok(tokWord, word)
	}
	l.i++
	return tok(tokOther, s[start:l.i])
}

// skipBlockComment skips a /* comment */; PostgreSQL's nest, SQLite's do
// not. An unterminated one runs to the end.
func (l *lexer) skipBlockComment() {
	s := l.s
	l.i += 2
	depth := 1
	for l.i < len(s) {
		switch {
		case s[l.i] == '*' && l.i+1 < len(s) && s[l.i+1] == '/':
			l.i += 2
			if depth--; depth == 0 {
				return
			}
		case l.pg() && s[l.i] == '/' && l.i+1 < len(s) && s[l.i+1] == '*':
			l.i += 2
			depth++
		default:
			l.i++
		}
	}
}

// quoted skips a literal that starts at l.i with q and ends at the next q
// not doubled (nor, with backslash, escaped by '\'); it returns what is
// between the quotes, as written. An unterminated one runs to the end.
func (l *lexer) quoted(q byte, backslash bool) string {
	s := l.s
	start := l.i + 1
	for l.i = start; l.i < len(s); l.i++ {
		switch c := s[l.i]; {
		case backslash && c == '\\':
			l.i++
		case c == q:
			if l.i+1 < len(s) && s[l.i+1] == q {
				l.i++
				continue
			}
			l.i++
			return s[start : l.i-1]
		}
	}
	l.i = len(s)
	return s[start:]
}

// sqliteVariable skips one of SQLite's named parameters ($name, @name,
// :name, #name), which, as in Tcl, may go on with "::name" and end with a
// "(...)" suffix that takes anything but whitespace up to ')': in
// "$a(';COMMIT)" the quote belongs to the parameter, and the COMMIT runs.
func (l *lexer) sqliteVariable() {
	s := l.s
	l.i++
	n := 0
	for l.i < len(s) {
		c := s[l.i]
		switch {
		case isIdentChar(c):
			n++
			l.i++
			continue
		case c == '(' && n > 0:
			for l.i++; l.i < len(s) && !isSpace(s[l.i]) && s[l.i] != ')'; l.i++ {
			}
			if l.i < len(s) && s[l.i] == ')' {
				l.i++
			}
			return
		case c == ':' && l.i+1 < len(s) && s[l.i+1] == ':':
			l.i += 2
			continue
		}
		return
	}
}

// dollarQuote skips a PostgreSQL dollar-quoted string ($$...$$,
// $tag$...$tag$) starting at l.i, if one starts there.
func (l *lexer) dollarQuote() bool {
	s := l.s
	j := l.i + 1
	if j < len(s) && isIdentStart(s[j]) {
		for j < len(s) && (isIdentStart(s[j]) || s[j] >= '0' && s[j] <= '9') {
			j++
		}
	}
	if j >= len(s) || s[j] != '$' {
		return false
	}
	delim := s[l.i : j+1]
	end := strings.Index(s[j+1:], delim)
	if end < 0 {
		l.i = len(s)
	} else {
		l.i = j + 1 + end + len(delim)
	}
	return true
}

// SQLite's statement boundaries, after sqlite3_complete: a semicolon ends
// a statement except inside the body of CREATE [TEMP] TRIGGER … BEGIN …
// END, whose statements end with semicolons of their own; there the
// statement ends at a semicolon after "; END". (PostgreSQL needs no such
// state: its bodies are quoted.)
const (
	trigStart = iota
	trigNormal
	trigExplain
	trigCreate
	trigTrigger
	trigSemi
	trigEnd
)

// stmtState is what the guard knows of the statement being read.
type stmtState struct {
	first [keepTokens]token // its first tokens, enough to classify it
	n     int               // how many of them there are
	trig  int
	start int // byte offset of its first token
	why   string
}

const keepTokens = 4

// scanStatements classifies every statement of q.
func scanStatements(q string, mode lexMode) error {
	l := lexer{s: q, mode: mode}
	var st stmtState
	for {
		t, ok := l.next()
		if !ok {
			return st.refusal(q, len(q))
		}
		if t.kind == tokSemi && st.ends(mode) {
			if err := st.refusal(q, t.start); err != nil {
				return err
			}
			st = stmtState{}
			continue
		}
		st.add(t, mode)
	}
}

// ends reports whether a semicolon ends the statement, moving the trigger
// state on.
func (st *stmtState) ends(mode lexMode) bool {
	if mode != lexSQLite {
		return true
	}
	switch st.trig {
	case trigTrigger:
		st.trig = trigSemi
		return false
	case trigSemi:
		return false
	}
	return true
}

func (st *stmtState) add(t token, mode lexMode) {
	if st.n == 0 {
		st.start = t.start
	}
	if st.n < keepTokens {
		st.first[st.n] = t
		st.n++
	}
	named := t.kind == tokWord || t.kind == tokQuoted
	if mode != lexSQLite && named && (foldIs(t.text, "set_config") || foldIs(t.text, "pg_settings")) {
		// set_config(), and UPDATE pg_settings which calls it, change
		// settings like SET does.
		st.why = whySetting
	}
	if mode == lexSQLite && t.kind != tokSemi { // ends moved the state on a semicolon
		st.trig = nextTrig(st.trig, t)
	}
}

func nextTrig(state int, t token) int {
	kw := ""
	if t.kind == tokWord && len(t.text) <= len("temporary") {
		kw = asciiLower(t.text)
	}
	switch state {
	case trigStart:
		switch kw {
		case "explain":
			return trigExplain
		case "create":
			return trigCreate
		}
		return trigNormal
	case trigNormal:
		return trigNormal
	case trigExplain:
		if kw == "create" {
			return trigCreate
		}
		switch kw {
		case "explain", "temp", "temporary", "trigger", "end":
			return trigNormal
		}
		return trigExplain
	case trigCreate:
		switch kw {
		case "temp", "temporary":
			return trigCreate
		case "trigger":
			return trigTrigger
		}
		return trigNormal
	case trigTrigger:
		return trigTrigger
	case trigSemi:
		if kw == "end" {
			return trigEnd
		}
		return trigTrigger
	case trigEnd:
		return trigTrigger
	}
	return state
}

// refusal classifies the statement read so far, which ends at offset end.
func (st *stmtState) refusal(q string, end int) error {
	if st.n == 0 {
		return nil
	}
	why := st.why
	if t := st.first[0]; t.kind == tokWord && len(t.text) <= len("deallocate") {
		var buf [len("deallocate")]byte
		kw := buf[:copy(buf[:], t.text)]
		for i, c := range kw {
			if c >= 'A' && c <= 'Z' {
				kw[i] = c + 'a' - 'A'
			}
		}
		if w, ok := refusedFirst[string(kw)]; ok { // no allocation: the compiler looks up kw in place
			why = w
			if string(kw) == "end" && st.isAtomicEnd() {
				why = whyAtomic
			}
		} else if string(kw) == "pragma" && !readOnlyPragmas[st.pragmaName()] {
			why = whyPragma
		}
	}
	if why == "" {
		return nil
	}
	return &refusedError{stmt: excerpt(q[st.start:end]), why: why}
}

// isAtomicEnd: a lone END, most likely the end of a BEGIN ATOMIC body.
func (st *stmtState) isAtomicEnd() bool { return st.n == 1 }

// pragmaName is the name of the pragma a PRAGMA statement runs, lower
// case, without its schema ("main.table_info" gives "table_info").
func (st *stmtState) pragmaName() string {
	f := st.first[:st.n]
	name := func(i int) string {
		if i < len(f) && (f[i].kind == tokWord || f[i].kind == tokQuoted) {
			return asciiLower(f[i].text)
		}
		return ""
	}
	if len(f) >= 3 && f[2].kind == tokOther && f[2].text == "." {
		return name(3)
	}
	return name(1)
}

// foldIs reports whether s is lit (lower case) in any ASCII case.
func foldIs(s, lit string) bool {
	if len(s) != len(lit) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lit[i] {
			return false
		}
	}
	return true
}

// asciiLower lowers ASCII letters only: both databases match keywords so,
// and strings.ToLower would fold other letters into ASCII ones.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// excerpt shortens a statement for an error message.
func excerpt(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	const max = 60
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && s[cut]&0xc0 == 0x80 { // not inside a UTF-8 sequence
		cut--
	}
	return s[:cut] + "…"
}
