package outbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/schemacheck"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// structuredAndNote returns a result's structured content as JSON without
// the layer's replay note, and the note ("" if none).
func structuredAndNote(t *testing.T, res *mcp.CallToolResult) (string, string) {
	t.Helper()
	if res.StructuredContent == nil {
		return "", ""
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return string(b), "" // not an object: it cannot hold a note
	}
	note, _ := m[outbox.ReplayNoteProperty].(string)
	delete(m, outbox.ReplayNoteProperty)
	b, _ = json.Marshal(m)
	return string(b), note
}

// listedOutputSchema is the output schema tools/list gives for name, as
// JSON ("" for none).
func listedOutputSchema(t *testing.T, cs *mcp.ClientSession, name string) string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range res.Tools {
		if tool.Name != name {
			continue
		}
		if tool.OutputSchema == nil {
			return ""
		}
		b, err := json.Marshal(tool.OutputSchema)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	t.Fatalf("tools/list has no tool %q", name)
	return ""
}

// validate checks res's structured content against schema (JSON) with
// jsonschema-go, as a strict client (AJV in the TypeScript SDK, jsonschema
// in the Python SDK) would.
func validate(t *testing.T, schema string, res *mcp.CallToolResult) error {
	t.Helper()
	var s jsonschema.Schema
	if err := json.Unmarshal([]byte(schema), &s); err != nil {
		t.Fatalf("listed output schema %s: %v", schema, err)
	}
	resolved, err := s.Resolve(nil)
	if err != nil {
		t.Fatalf("resolve %s: %v", schema, err)
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return resolved.Validate(v)
}

// wantNoteProperty checks that schema lists the note as an optional
// string, in a form strict clients accept.
func wantNoteProperty(t *testing.T, schema string) {
	t.Helper()
	var s struct {
		Properties map[string]struct {
			Type        string `json:"type"`
			Description string `json:"description"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if err := json.Unmarshal([]byte(schema), &s); err != nil {
		t.Fatal(err)
	}
	p, ok := s.Properties[outbox.ReplayNoteProperty]
	if !ok || p.Type != "string" || !strings.Contains(p.Description, "only when") {
		t.Errorf("output schema %s: want an optional string property %q described as set only on a replay", schema, outbox.ReplayNoteProperty)
	}
	for _, r := range s.Required {
		if r == outbox.ReplayNoteProperty {
			t.Errorf("output schema %s requires %q", schema, outbox.ReplayNoteProperty)
		}
	}
	if err := schemacheck.Strict(json.RawMessage(schema)); err != nil {
		t.Errorf("output schema %s: %v", schema, err)
	}
}

// A replay of a tool with an output schema carries its note in the
// structured content, which is all Claude Code shows the model, and stays
// valid against the schema the tool lists, even a struct's, which forbids
// other properties (additionalProperties: false).
func TestReplayNote_StructuredContentValid(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"order-1", ""} {
		t.Run("key="+key, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, nil)
			schema := listedOutputSchema(t, b.session, "charge")
			if !strings.Contains(schema, `"additionalProperties":false`) {
				t.Fatalf("charge's output schema %s: want a struct's, with additionalProperties false", schema)
			}
			wantNoteProperty(t, schema)

			first := callCharge(t, b.session, key, 100)
			if _, note := structuredAndNote(t, first); note != "" || first.IsError {
				t.Fatalf("first call: %s, note %q", text(first), note)
			}
			if err := validate(t, schema, first); err != nil {
				t.Errorf("first result against the listed schema: %v", err)
			}
			second := callCharge(t, b.session, key, 100)
			if callMeta(second)["replayed"] != true {
				t.Fatalf("second call not replayed: %s", text(second))
			}
			got, note := structuredAndNote(t, second)
			want, _ := structuredAndNote(t, first)
			if got != want {
				t.Errorf("replayed structured content %s, want %s with the note", got, want)
			}
			if !strings.HasPrefix(note, "[mcp-outbox] Replayed: ") || !strings.Contains(note, "did not run again") {
				t.Errorf("note in structured content %q", note)
			}
			if !strings.Contains(text(second), note) {
				t.Errorf("content %q does not carry the note %q", text(second), note)
			}
			if err := validate(t, schema, second); err != nil {
				t.Errorf("replay against the listed schema: %v", err)
			}
			// The schema without the property refuses it: the check is real.
			var bare map[string]any
			_ = json.Unmarshal([]byte(schema), &bare)
			delete(bare["properties"].(map[string]any), outbox.ReplayNoteProperty)
			strict, _ := json.Marshal(bare)
			if err := validate(t, string(strict), second); err == nil {
				t.Errorf("the schema without %q accepted the replay", outbox.ReplayNoteProperty)
			}
		})
	}
}

// A retry that arrives while the original runs waits for it and gets its
// result: its note says so, not that a record was replayed. Not parallel:
// waitingOnOriginal counts the waiters of every test.
func TestReplayNote_Join(t *testing.T) {
	b := setup(t, nil, nil)
	g := addGate(b.layer, b.server)
	schema := listedOutputSchema(t, b.session, "gate")
	wantNoteProperty(t, schema)
	orig := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := callErr(context.Background(), b.session, "gate", "j1", map[string]any{"n": 1})
		if err != nil {
			t.Error(err)
		}
		orig <- res
	}()
	<-g.started
	dup := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := callErr(context.Background(), connect(t, b.server), "gate", "j1", map[string]any{"n": 1})
		if err != nil {
			t.Error(err)
		}
		dup <- res
	}()
	waitFor(t, func() bool { return waitingOnOriginal() == 1 })
	close(g.release)
	first, joined := <-orig, <-dup
	if first == nil || joined == nil {
		t.Fatal("no answer")
	}
	if _, note := structuredAndNote(t, first); note != "" {
		t.Errorf("the original has a note: %q", note)
	}
	got, note := structuredAndNote(t, joined)
	if want, _ := structuredAndNote(t, first); got != want {
		t.Errorf("joined %s, want %s", got, want)
	}
	if !strings.HasPrefix(note, "[mcp-outbox] Joined: an earlier attempt of the call with idempotency key \"j1\" was still running") ||
		!strings.Contains(note, "The tool ran once") {
		t.Errorf("join note %q", note)
	}
	if !strings.Contains(text(joined), note) {
		t.Errorf("content %q lacks the note", text(joined))
	}
	if m := callMeta(joined); m["replayed"] != true || m["joined"] != true {
		t.Errorf("join's _meta %v: want replayed and joined", m)
	}
	if err := validate(t, schema, joined); err != nil {
		t.Errorf("joined result against the listed schema: %v", err)
	}
	if g.runs.Load() != 1 {
		t.Errorf("handler ran %d times", g.runs.Load())
	}
}

type ptrOut struct {
	N    int    `json:"n"`
	Name string `json:"name"`
}

type withNoteField struct {
	Note string `json:"mcp_outbox"`
}

// The schemas AddTool lists, tool by tool: a pointer Out whose handler
// returns nil still sends the zero value (the SDK's own rule for a schema
// it infers); a tool with no output schema gets the note in its free-form
// structured content; an unrecorded tool's schema is not changed; a schema
// that is not a plain object is left alone, and its replays carry the note
// in content only.
func TestReplayNote_Schemas(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "nil_out", Description: "returns a nil *ptrOut"},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, *ptrOut, error) {
			return nil, nil, nil
		}, nil)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "free_form", Description: "no output schema"},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
			return nil, map[string]any{"done": true}, nil
		}, nil)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "idem", Description: "unrecorded",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, ptrOut, error) {
			return nil, ptrOut{N: 1}, nil
		}, nil)
	oneOf := json.RawMessage(`{"oneOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},` +
		`{"type":"object","properties":{"b":{"type":"integer"}},"required":["b"],"additionalProperties":false}]}`)
	outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "one_of", Description: "composed output schema", OutputSchema: oneOf},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, map[string]int, error) {
			return nil, map[string]int{"a": 1}, nil
		}, nil)

	t.Run("NilPointerOut", func(t *testing.T) {
		schema := listedOutputSchema(t, b.session, "nil_out")
		wantNoteProperty(t, schema)
		first := call(t, b.session, "nil_out", "n1", map[string]any{})
		if got, _ := structuredAndNote(t, first); first.IsError || got != `{"n":0,"name":""}` {
			t.Fatalf("first: %s %s, want the zero value", got, text(first))
		}
		second := call(t, b.session, "nil_out", "n1", map[string]any{})
		if _, note := structuredAndNote(t, second); note == "" {
			t.Errorf("replay without a note: %v", second.StructuredContent)
		}
		if err := validate(t, schema, second); err != nil {
			t.Errorf("replay against the listed schema: %v", err)
		}
	})
	t.Run("NoOutputSchema", func(t *testing.T) {
		if schema := listedOutputSchema(t, b.session, "free_form"); schema != "" {
			t.Errorf("free_form lists output schema %s", schema)
		}
		first := call(t, b.session, "free_form", "f1", map[string]any{})
		second := call(t, b.session, "free_form", "f1", map[string]any{})
		got, note := structuredAndNote(t, second)
		if want, _ := structuredAndNote(t, first); note == "" || got != want {
			t.Errorf("replay %v: want %s with a note", second.StructuredContent, want)
		}
	})
	t.Run("Unrecorded", func(t *testing.T) {
		if schema := listedOutputSchema(t, b.session, "idem"); strings.Contains(schema, outbox.ReplayNoteProperty) {
			t.Errorf("an unrecorded tool lists the note: %s", schema)
		}
	})
	t.Run("ComposedSchema", func(t *testing.T) {
		schema := listedOutputSchema(t, b.session, "one_of")
		if strings.Contains(schema, outbox.ReplayNoteProperty) {
			t.Errorf("a oneOf schema was changed: %s", schema)
		}
		call(t, b.session, "one_of", "o1", map[string]any{})
		second := call(t, b.session, "one_of", "o1", map[string]any{})
		if _, note := structuredAndNote(t, second); note != "" || callMeta(second)["replayed"] != true {
			t.Errorf("replay %v: want the note in content only", second.StructuredContent)
		}
		if !strings.Contains(text(second), "[mcp-outbox] Replayed") {
			t.Errorf("content %q lacks the note", text(second))
		}
		if err := validate(t, schema, second); err != nil {
			t.Errorf("replay against the listed schema: %v", err)
		}
	})
}

// The property's name is the layer's: a tool whose output declares it is
// refused where it is registered, whether Out or the tool's schema names it.
func TestAddTool_ReservedNoteProperty(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	wantPanic := func(name string, register func()) {
		t.Helper()
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(r.(string), `"mcp_outbox"`) || !strings.Contains(r.(string), name) {
				t.Errorf("%s: panic %v, want one naming the tool and the property", name, r)
			}
		}()
		register()
	}
	wantPanic("typed", func() {
		outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "typed"},
			func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, withNoteField, error) {
				return nil, withNoteField{}, nil
			}, nil)
	})
	wantPanic("declared", func() {
		outbox.AddTool(b.layer, b.server, &mcp.Tool{Name: "declared",
			OutputSchema: json.RawMessage(`{"type":"object","properties":{"mcp_outbox":{"type":"integer"}}}`)},
			func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
				return nil, nil, nil
			}, nil)
	})
}
