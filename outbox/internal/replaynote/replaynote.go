// Package replaynote puts the layer's note on a replayed (or joined) tool
// result into the result's structured content, and advertises it in the
// tool's output schema, for both the layer's own tools (outbox.AddTool) and
// the tools the proxy (outbox/sidecar) lists for an upstream.
//
// Why structured content: a client that gets a result with
// structuredContent may show the model only that. Claude Code (2.1.332)
// gives the model structuredContent as JSON and drops the content blocks
// and _meta, so a note in content alone never reaches the model there.
//
// Why the schema: strict clients validate structuredContent against the
// tool's outputSchema (the TypeScript SDK with AJV, the Python SDK with
// jsonschema), and go-sdk's jsonschema.For gives a struct
// "additionalProperties": false. An extra member that the schema does not
// name would turn a replay into a validation error on the client. So every
// recorded tool's output schema lists the member as an optional string;
// a first execution never sets it, and the SDK's own validation of the
// handler's output still passes.
package replaynote

import (
	"encoding/json"
	"errors"
	"slices"
)

// Property is the member of structuredContent that holds the note. Its
// name is part of what clients see: tests of hosts assert on it.
const Property = "mcp_outbox"

// Description is the advertised property's description, which is what a
// model reading the schema learns of it.
const Description = "Set by mcp-outbox only when this result is not a new execution: a retry got the recorded " +
	"result of an earlier identical call (a replay), or waited for an earlier attempt of the call that was still " +
	"running and got its result. The tool did not run again. Absent on a first execution."

// ErrDeclared: the schema already has a property named [Property], which
// belongs to the tool; the layer must not write into it.
var ErrDeclared = errors.New(`the output schema already declares a property "` + Property + `", which mcp-outbox reserves for its replay note`)

// ErrNotObject: the schema does not describe a plain JSON object whose
// properties the layer can extend (its root is not "type": "object", or
// it composes subschemas, whose own additionalProperties a new top-level
// property would not satisfy). Results of such a tool carry the note in
// content only.
var ErrNotObject = errors.New("the output schema is not a plain object schema")

// rootKeywordsRefused are root keywords under which an added property may
// still be invalid: subschemas with their own additionalProperties, a
// property-name pattern, a limit on the number of members.
var rootKeywordsRefused = []string{"allOf", "anyOf", "oneOf", "not", "if", "$ref", "$dynamicRef", "propertyNames", "maxProperties"}

// propertySchema is what Amend adds under properties.
var propertySchema = func() json.RawMessage {
	b, err := json.Marshal(map[string]string{"type": "string", "description": Description})
	if err != nil {
		panic(err)
	}
	return b
}()

// Amend returns schema (a JSON Schema as JSON) with [Property] added as an
// optional string property. Every other member stays as it was written
// (raw JSON: numbers keep their digits), though the members' order may
// change. It returns [ErrDeclared] or [ErrNotObject], with schema
// unchanged, when the property cannot be added.
func Amend(schema json.RawMessage) (json.RawMessage, error) {
	var root map[string]json.RawMessage
	if err := json.Unmarshal(schema, &root); err != nil || root == nil {
		return schema, ErrNotObject
	}
	if !typeIsObject(root["type"]) {
		return schema, ErrNotObject
	}
	for _, kw := range rootKeywordsRefused {
		if _, ok := root[kw]; ok {
			return schema, ErrNotObject
		}
	}
	props := map[string]json.RawMessage{}
	if raw, ok := root["properties"]; ok {
		if err := json.Unmarshal(raw, &props); err != nil || props == nil {
			return schema, ErrNotObject
		}
	}
	if _, ok := props[Property]; ok {
		return schema, ErrDeclared
	}
	props[Property] = propertySchema
	var err error
	if root["properties"], err = json.Marshal(props); err != nil {
		return schema, err
	}
	b, err := json.Marshal(root)
	if err != nil {
		return schema, err
	}
	return b, nil
}

// typeIsObject reports whether a schema's "type" is "object", or a list
// holding it.
func typeIsObject(raw json.RawMessage) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == "object"
	}
	var many []string
	return json.Unmarshal(raw, &many) == nil && slices.Contains(many, "object")
}

// Add returns structured (a result's structuredContent) with note under
// [Property], as raw JSON whose other members keep their text. It returns
// false, and structured unchanged, when structured is not a JSON object or
// already has the member (a tool's own, which is never overwritten).
func Add(structured any, note string) (any, bool) {
	if structured == nil {
		return structured, false
	}
	b, ok := structured.(json.RawMessage)
	if !ok {
		var err error
		if b, err = json.Marshal(structured); err != nil {
			return structured, false
		}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return structured, false
	}
	if _, ok := m[Property]; ok {
		return structured, false
	}
	n, err := json.Marshal(note)
	if err != nil {
		return structured, false
	}
	m[Property] = n
	out, err := json.Marshal(m)
	if err != nil {
		return structured, false
	}
	return json.RawMessage(out), true
}

// Allowed reports whether a tool whose listed output schema was passed
// through [Amend] (schema as it was before; nil for none) may carry the
// note in its structured content: it has no schema, or Amend added the
// property.
func Allowed(schema any) bool {
	if schema == nil {
		return true
	}
	b, ok := schema.(json.RawMessage)
	if !ok {
		var err error
		if b, err = json.Marshal(schema); err != nil {
			return false
		}
	}
	if string(b) == "null" {
		return true
	}
	_, err := Amend(b)
	return err == nil
}

// AmendTool amends the outputSchema of a tool definition as tools/list
// lists it (raw JSON), keeping every other member as it was written. A
// tool without an output schema, or with one [Amend] leaves alone, is
// returned unchanged.
func AmendTool(tool json.RawMessage) json.RawMessage {
	var t map[string]json.RawMessage
	if err := json.Unmarshal(tool, &t); err != nil || t == nil {
		return tool
	}
	schema, ok := t["outputSchema"]
	if !ok || string(schema) == "null" {
		return tool
	}
	amended, err := Amend(schema)
	if err != nil {
		return tool
	}
	t["outputSchema"] = amended
	b, err := json.Marshal(t)
	if err != nil {
		return tool
	}
	return b
}
