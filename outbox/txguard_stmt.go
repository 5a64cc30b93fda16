package outbox

import "strings"

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
