package schemacheck

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestStrict(t *testing.T) {
	for _, tc := range []struct {
		schema string
		bad    string // "" when the schema passes; else a path the error names
	}{
		{`{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}`, ""},
		{`{"type":"object","properties":{"result":true}}`, "/properties/result"},
		{`{"type":"object","properties":{"list":{"type":"array","items":true}}}`, "/properties/list/items"},
		{`{"anyOf":[{"type":"string"},false]}`, "/anyOf/1"},
		{`{"$defs":{"x":true}}`, "/$defs/x"},
		{`{"type":"object","additionalProperties":{"properties":{"y":true}}}`, "/additionalProperties/properties/y"},
		{`true`, "the schema itself"},
	} {
		err := Strict(json.RawMessage(tc.schema))
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%s: %v, want no error", tc.schema, err)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%s: %v, want an error naming %s", tc.schema, err, tc.bad)
		}
	}
}
