// Package schemacheck checks tool schemas against what the strictest MCP
// clients accept, which is less than JSON Schema allows.
//
// The TypeScript SDK's listTools, @langchain/mcp-adapters and the official
// conformance suite validate a tool's inputSchema and outputSchema with a
// schema of their own that wants an object (not the boolean schemas `true`
// or `false`) for every entry of "properties", for "items" and for every
// entry of "anyOf", "oneOf", "allOf" and "$defs". A server advertising
// `"result": true` cannot be used by them at all: they refuse the whole
// tools/list answer.
package schemacheck

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Strict returns an error naming every place in schema (a JSON Schema as
// JSON, or any value that marshals to one) where a strict client wants a
// schema object and finds something else.
func Strict(schema any) error {
	b, ok := schema.(json.RawMessage)
	if !ok {
		var err error
		if b, err = json.Marshal(schema); err != nil {
			return err
		}
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	var bad []string
	if _, ok := v.(map[string]any); !ok {
		bad = append(bad, "the schema itself")
	} else {
		walk(v, "", &bad)
	}
	if len(bad) > 0 {
		return fmt.Errorf("not a schema object: %s", strings.Join(bad, ", "))
	}
	return nil
}

// walk checks the subschemas of the schema object v at path.
func walk(v any, path string, bad *[]string) {
	m, ok := v.(map[string]any)
	if !ok {
		*bad = append(*bad, path)
		return
	}
	for _, kw := range []string{"properties", "$defs", "definitions", "patternProperties"} {
		if sub, ok := m[kw].(map[string]any); ok {
			for name, s := range sub {
				walk(s, path+"/"+kw+"/"+name, bad)
			}
		}
	}
	for _, kw := range []string{"anyOf", "oneOf", "allOf"} {
		if list, ok := m[kw].([]any); ok {
			for i, s := range list {
				walk(s, fmt.Sprintf("%s/%s/%d", path, kw, i), bad)
			}
		}
	}
	for _, kw := range []string{"items", "not"} {
		if s, ok := m[kw]; ok {
			walk(s, path+"/"+kw, bad)
		}
	}
	// "additionalProperties": false is a boolean schema too, but every
	// strict client accepts it there: only an object is walked.
	if s, ok := m["additionalProperties"].(map[string]any); ok {
		walk(s, path+"/additionalProperties", bad)
	}
}
