package replaynote

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestAmend(t *testing.T) {
	for _, tc := range []struct {
		name, schema string
		err          error
	}{
		{"struct", `{"type":"object","properties":{"id":{"type":"integer","maximum":9007199254740993}},"required":["id"],"additionalProperties":false}`, nil},
		{"no properties", `{"type":"object"}`, nil},
		{"type list", `{"type":["object","null"],"properties":{}}`, nil},
		{"declared", `{"type":"object","properties":{"mcp_outbox":{"type":"string"}}}`, ErrDeclared},
		{"array", `{"type":"array","items":{"type":"string"}}`, ErrNotObject},
		{"no type", `{"properties":{"a":{}}}`, ErrNotObject},
		{"oneOf", `{"type":"object","oneOf":[{"properties":{"a":{}}}]}`, ErrNotObject},
		{"ref", `{"type":"object","$ref":"#/$defs/x","$defs":{"x":{"type":"object"}}}`, ErrNotObject},
		{"maxProperties", `{"type":"object","maxProperties":1}`, ErrNotObject},
		{"boolean", `true`, ErrNotObject},
		{"null", `null`, ErrNotObject},
		{"bad properties", `{"type":"object","properties":[]}`, ErrNotObject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Amend(json.RawMessage(tc.schema))
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				if string(got) != tc.schema {
					t.Errorf("refused, yet changed: %s", got)
				}
				if tc.schema != "null" && Allowed(json.RawMessage(tc.schema)) { // null: no schema
					t.Errorf("Allowed, though Amend refused")
				}
				return
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(got, &m); err != nil {
				t.Fatal(err)
			}
			var props map[string]json.RawMessage
			if err := json.Unmarshal(m["properties"], &props); err != nil {
				t.Fatal(err)
			}
			if string(props[Property]) != string(propertySchema) {
				t.Errorf("property %s, want %s", props[Property], propertySchema)
			}
			if strings.Contains(tc.schema, "9007199254740993") && !strings.Contains(string(got), "9007199254740993") {
				t.Errorf("a number changed: %s", got)
			}
			if strings.Contains(string(m["required"]), Property) {
				t.Errorf("required: %s", m["required"])
			}
			if !Allowed(json.RawMessage(tc.schema)) {
				t.Errorf("not Allowed, though Amend added it")
			}
		})
	}
	if !Allowed(nil) {
		t.Error("a tool without a schema: not Allowed")
	}
}

func TestAdd(t *testing.T) {
	got, ok := Add(map[string]any{"id": 1}, "note")
	if b, _ := json.Marshal(got); !ok || string(b) != `{"id":1,"mcp_outbox":"note"}` {
		t.Errorf("Add to a map: %s %v", b, ok)
	}
	got, ok = Add(json.RawMessage(`{"big":9007199254740993}`), "n")
	if b, _ := json.Marshal(got); !ok || string(b) != `{"big":9007199254740993,"mcp_outbox":"n"}` {
		t.Errorf("Add to raw JSON: %s %v", b, ok)
	}
	for _, sc := range []any{nil, []any{1}, "text", json.RawMessage(`null`), map[string]any{Property: "the tool's"}} {
		if got, ok := Add(sc, "n"); ok {
			t.Errorf("Add(%v) = %v, want it left alone", sc, got)
		}
	}
}

func TestAmendTool(t *testing.T) {
	tool := `{"name":"charge","inputSchema":{"type":"object","properties":{"n":{"type":"integer","maximum":9007199254740993}}},` +
		`"outputSchema":{"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":false}}`
	got := string(AmendTool(json.RawMessage(tool)))
	if !strings.Contains(got, `"mcp_outbox":{"description":`) || !strings.Contains(got, "9007199254740993") {
		t.Errorf("AmendTool: %s", got)
	}
	for _, same := range []string{`{"name":"x","inputSchema":{"type":"object"}}`, `{"name":"x","outputSchema":{"type":"array"}}`, `[]`} {
		if got := string(AmendTool(json.RawMessage(same))); got != same {
			t.Errorf("AmendTool(%s) = %s, want it unchanged", same, got)
		}
	}
}
