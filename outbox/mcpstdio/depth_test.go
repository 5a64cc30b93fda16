package mcpstdio

import (
	"strings"
	"testing"
)

func TestIDBeforeOverflow(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", jsonMaxDepth) + strings.Repeat("]", jsonMaxDepth)
	for _, c := range []struct {
		line    string
		id      string // "" for none
		tooDeep bool
	}{
		{`{"id":1,"params":` + deep + `}`, `1`, true},
		{`{"id":"a\"b}]","params":` + deep + `}`, `"a\"b}]"`, true},
		{`{"id":1,"id":2,"params":` + deep + `}`, `2`, true}, // the last, as encoding/json takes it
		{`{"s":"[[[[","id":3,"p":{"q":` + deep + `}}`, `3`, true},
		{`{"id":{"no":1},"params":` + deep + `}`, ``, true},
		{`{"id":null,"params":` + deep + `}`, ``, true},
		{`{"params":` + deep + `,"id":1}`, ``, true},
		{`{"id":1,,"params":` + deep + `}`, ``, true},
		{`[{"id":1,"params":` + deep + `}]`, ``, true},
		{`{"id":1,"params":[[[]]]`, ``, false},                                                                         // truncated, not deep
		{`{"id":1,"s":"` + strings.Repeat("[", 2*jsonMaxDepth) + `"`, ``, false},                                       // brackets in a string
		{`{"id":1,"p":` + strings.Repeat("[", jsonMaxDepth-1) + strings.Repeat("]", jsonMaxDepth-1) + `}x`, ``, false}, // at the limit
	} {
		id, tooDeep := idBeforeOverflow([]byte(c.line))
		if string(id) != c.id || tooDeep != c.tooDeep {
			t.Errorf("idBeforeOverflow(%.60s…) = %s, %v; want %s, %v", c.line, id, tooDeep, c.id, c.tooDeep)
		}
	}
}
