package mcphttp

import (
	"bytes"
	"encoding/json"
)

// The lift and the depth bound read a body with the linear scans below,
// without decoding it: the go-sdk decodes every body itself (more than
// once: see checkDepth), and a decode of ours would add a copy of the
// whole body and its cost again. A scan finds the spans of the members a
// lift needs; a lift splices bytes into the body at those spans.
//
// The scans trust the JSON only as far as finding ends goes: a lift is
// kept only when the body it came from is valid JSON (json.Valid, linear
// and without allocations), so that what reaches the SDK is what it would
// have refused anyway, or valid JSON.

// checkDepth returns the offset of the first '{' or '[' of b that opens a
// level deeper than max, or -1 when b nests no deeper. It tracks the depth
// outside strings in one pass, without allocations, and stops there.
//
// Why a bound of ours, below the go-sdk's own (1000, checked the same way
// in its internal/json.Unmarshal): the go-sdk decodes with
// github.com/segmentio/encoding/json, whose decodeInterface (a value
// decoded into any, as _meta and, for their schema validation, a tool's
// arguments are) first calls parseValue to find the end of the whole
// value, then decodes its members, each of which, being decoded into any
// too, is found the same way again. So every level re-scans everything
// below it: a body nested d deep costs about d times its size, quadratic
// in depth, and the body is decoded several times over (readBatch in the
// stateless handler's ephemeralConnectOpts, again in the transport's
// ServeHTTP, then the call's params). 1 MB nested 990 deep took 5 s of
// CPU against 0.4 s flat.
func checkDepth(b []byte, max int) int {
	depth := 0
	inString, escaped := false, false
	for i, c := range b {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > max {
				return i
			}
		case '}', ']':
			if depth > 0 {
				depth--
			}
		}
	}
	return -1
}

// idBeforeCut returns the id of the message b when b is an object whose
// top-level members before cut (where it nests too deep) are well-formed
// and hold a usable id (a string or a number; the last, as decoders take
// it), else null: the refusal then goes to the request's id, which a
// client matches to its request, as the stdio transport's does. Nothing
// after the cut is looked at.
func idBeforeCut(b []byte, cut int) json.RawMessage {
	null := json.RawMessage("null")
	obj := b[:cut]
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return null
	}
	var id []byte
	for i = skipSpace(obj, i+1); ; i = skipSpace(obj, i+1) {
		if i >= len(obj) || obj[i] != '"' {
			return null
		}
		kend := skipString(obj, i)
		if kend < 0 || !json.Valid(obj[i:kend]) {
			return null
		}
		key := obj[i+1 : kend-1]
		if i = skipSpace(obj, kend); i >= len(obj) || obj[i] != ':' {
			return null
		}
		vs, ve := skipValue(obj, i+1)
		if ve < 0 {
			break // the member the cut is in
		}
		if !json.Valid(obj[vs:ve]) {
			return null
		}
		if keyIs(key, "id") {
			id = obj[vs:ve]
		}
		if i = skipSpace(obj, ve); i >= len(obj) || obj[i] != ',' {
			return null
		}
	}
	var v any
	if id == nil || json.Unmarshal(id, &v) != nil {
		return null
	}
	switch v.(type) {
	case string, float64:
		return id
	}
	return null
}

// span is a value's bytes b[start:end]; end == 0 when absent.
type span struct{ start, end int }

func (s span) ok() bool { return s.end > 0 }

func (s span) of(b []byte) []byte { return b[s.start:s.end] }

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the value at b[i] (white space skipped
// first), or -1 when b ends before it does. It does not validate.
func skipValue(b []byte, i int) (start, end int) {
	i = skipSpace(b, i)
	if i >= len(b) {
		return i, -1
	}
	start = i
	switch b[i] {
	case '"':
		return start, skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return start, -1
				}
				i-- // the loop's i++
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return start, i + 1
				}
			}
		}
		return start, -1
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	if i == start {
		return start, -1
	}
	return start, i
}

// skipString returns the end of the string whose quote is b[i], or -1.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// members calls fn with the key and the value's span of each member of the
// object obj (an object's bytes, white space trimmed), in order; false
// when obj is not an object as far as the scan can tell.
func members(obj []byte, fn func(key []byte, v span)) bool {
	if len(obj) < 2 || obj[0] != '{' {
		return false
	}
	i := skipSpace(obj, 1)
	if i < len(obj) && obj[i] == '}' {
		return true
	}
	for i < len(obj) {
		if obj[i] != '"' {
			return false
		}
		kend := skipString(obj, i)
		if kend < 0 {
			return false
		}
		key := obj[i+1 : kend-1]
		i = skipSpace(obj, kend)
		if i >= len(obj) || obj[i] != ':' {
			return false
		}
		start, end := skipValue(obj, i+1)
		if end < 0 {
			return false
		}
		fn(key, span{start, end})
		i = skipSpace(obj, end)
		if i >= len(obj) {
			return false
		}
		switch obj[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(obj, i+1)
		default:
			return false
		}
	}
	return false
}

// fields returns the spans of the members of obj named by names, the last
// one of each where a name repeats (as encoding/json and the go-sdk's
// decoder read duplicates); ok is false when obj is not an object.
func fields(obj []byte, names ...string) (spans []span, ok bool) {
	spans = make([]span, len(names))
	ok = members(obj, func(key []byte, v span) {
		for i, n := range names {
			if keyIs(key, n) {
				spans[i] = v
			}
		}
	})
	return spans, ok
}

// keyIs reports whether the raw key (between its quotes) reads as name,
// escapes decoded as encoding/json decodes them.
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	var k string
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	return json.Unmarshal(q, &k) == nil && k == name
}

// stringIs reports whether the value v is the JSON string s.
func stringIs(v []byte, s string) bool {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return false
	}
	return keyIs(v[1:len(v)-1], s)
}

func isNullValue(v []byte) bool { return string(v) == "null" }

// splice is an edit of a body: ins replaces b[at:to].
type splice struct {
	at, to int
	ins    []byte
}

// apply returns b with the edits, which are in order and do not overlap,
// in one new slice.
func apply(b []byte, edits []splice) []byte {
	n := len(b)
	for _, e := range edits {
		n += len(e.ins) - (e.to - e.at)
	}
	out := make([]byte, 0, n)
	last := 0
	for _, e := range edits {
		out = append(out, b[last:e.at]...)
		out = append(out, e.ins...)
		last = e.to
	}
	return append(out, b[last:]...)
}
