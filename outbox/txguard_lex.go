package outbox

import "strings"

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
