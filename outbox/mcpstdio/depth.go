package mcpstdio

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// jsonMaxDepth is the nesting depth encoding/json accepts (its scanner's
// maxNestingDepth): json.Valid refuses a line that nests deeper, however
// well-formed, and so the filter cannot decode its id the usual way.
const jsonMaxDepth = 10000

// idBeforeOverflow looks at a line json.Valid refused. tooDeep reports
// whether it nests deeper than jsonMaxDepth. If it does, and it is an object
// whose top-level members up to the point of the overflow are well-formed,
// id is the "id" member among them (the last, as encoding/json would take),
// if any and usable; the error answer then goes to that id, so the client can
// match it to its request.
//
// Nothing here recurses or grows with the nesting: one pass counts the depth
// to find the overflow, then a json.Decoder reads the top-level members of
// the line up to that point, each member's value in one step of its
// iterative scanner (within its depth limit, since the overflow is cut off).
func idBeforeOverflow(line []byte) (id json.RawMessage, tooDeep bool) {
	cut := depthOverflow(line, jsonMaxDepth)
	if cut < 0 {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(line[:cut]))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, true
	}
	var found json.RawMessage
	for {
		tok, err := dec.Token()
		if err == nil {
			key, _ := tok.(string)
			var v json.RawMessage
			if err = dec.Decode(&v); err == nil {
				if key == "id" {
					found = v
				}
				continue
			}
		}
		// The walk must end where the line was cut, in the middle of the
		// member that nests too deep; any other error is a syntax error
		// before the overflow, and the line has no trustworthy id.
		if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return nil, true
		}
		break
	}
	if found == nil || !validID(found) {
		return nil, true
	}
	return found, true
}

// depthOverflow returns the offset of the first '{' or '[' of data that
// opens a level deeper than max, skipping strings, or -1.
func depthOverflow(data []byte, max int) int {
	depth := 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			if depth++; depth > max {
				return i
			}
		case '}', ']':
			depth--
		}
	}
	return -1
}
