// Package visible shows text that came from clients to operators as what
// it is. A format character (Unicode category Cf: the bidirectional
// overrides and isolates U+202A–U+202E and U+2066–U+2069, the zero-width
// characters U+200B–U+200F, U+FEFF, ...) changes how the text around it is
// drawn without being drawn itself: a tool-call id "x\u202egpj.exe" reads
// "xexe.jpg" (Trojan Source). A control character can rewrite a terminal
// line. Identifiers are stripped of both where they are stored
// (outbox's cleanToolCallID; idempotency keys are refused, callkey.Validate);
// what is shown is escaped here as well, so that rows stored before, and
// text no one strips (a tool's result, a destination's error), cannot
// spoof an operator's view either.
package visible

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Hidden reports whether r is drawn as something else than itself: a
// format character, or a control character other than tab and line breaks.
func Hidden(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}

// Name is how a hidden rune is shown: <U+202E>.
func Name(r rune) string { return fmt.Sprintf("<U+%04X>", r) }

// Text returns s with each hidden rune shown as its Name.
func Text(s string) string {
	if !has(s) {
		return s
	}
	b := make([]byte, 0, len(s)+16)
	for _, r := range s {
		if Hidden(r) {
			b = append(b, Name(r)...)
		} else {
			b = utf8.AppendRune(b, r)
		}
	}
	return string(b)
}

// HTML returns an HTML document with each hidden rune shown as its Name,
// escaped (&lt;U+202E&gt;). Whatever html/template wrote in a text or
// attribute context stays valid: the replacement is plain text. Markup
// never holds such runes, so every one it finds came from data.
func HTML(doc []byte) []byte {
	if !has(string(doc)) {
		return doc
	}
	out := make([]byte, 0, len(doc)+64)
	for i := 0; i < len(doc); {
		r, n := utf8.DecodeRune(doc[i:])
		if r != utf8.RuneError && Hidden(r) {
			out = fmt.Appendf(out, "&lt;U+%04X&gt;", r)
		} else {
			out = append(out, doc[i:i+n]...)
		}
		i += n
	}
	return out
}

// JSON returns JSON text with each format character written as a \u
// escape: the same value to any JSON reader, and visible to a person
// reading it. encoding/json escapes control characters already, and
// writes format characters as they are (it escapes only U+2028 and
// U+2029). Outside strings JSON text is ASCII, so every rune found is in
// a string.
func JSON(doc []byte) []byte {
	if !has(string(doc)) {
		return doc
	}
	out := make([]byte, 0, len(doc)+32)
	for i := 0; i < len(doc); {
		r, n := utf8.DecodeRune(doc[i:])
		switch {
		case r == utf8.RuneError || !unicode.Is(unicode.Cf, r):
			out = append(out, doc[i:i+n]...)
		case r > 0xFFFF:
			r -= 0x10000
			out = fmt.Appendf(out, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += n
	}
	return out
}

func has(s string) bool {
	for _, r := range s {
		if Hidden(r) {
			return true
		}
	}
	return false
}
