package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/replaynote"
)

// ReplayNoteProperty is the member of a replayed (or joined) result's
// structuredContent that holds the layer's note, the same text as the
// last content block. A client that shows the model only structured
// content (Claude Code does) would otherwise hide the replay from it. A
// recorded tool's output schema lists it as an optional string, so that
// strict clients still accept the result; a first execution never sets
// it.
const ReplayNoteProperty = replaynote.Property

// outputSchemaOf is what AddTool gives the SDK as a tool's output schema,
// and what the wrapped handler must do for the SDK in return.
type outputSchemaOf[Out any] struct {
	// noteAdvertised: a replay may carry the note in its structured
	// content (the schema lists the property, or there is no schema).
	noteAdvertised bool
	// zeroElem: Out is a pointer whose schema the SDK would have
	// inferred. The SDK then sends the element's zero value for a nil
	// output; handed a schema, it would send null, which an object schema
	// refuses. So the handler's nil is replaced first.
	zeroElem reflect.Type
}

// zeroFor returns out, or a pointer to a new zero element if out is a nil
// pointer the SDK would have replaced.
func (s outputSchemaOf[Out]) zeroFor(out Out) Out {
	if s.zeroElem == nil {
		return out
	}
	if v := reflect.ValueOf(out); !v.IsValid() || v.IsNil() {
		return reflect.New(s.zeroElem).Interface().(Out)
	}
	return out
}

// outputSchemaWithNote returns t, or a copy of t whose output schema (t's,
// else the one inferred from Out as mcp.AddTool would) lists the replay
// note's property, when record says the tool's calls are recorded. It
// fails when the schema already has a property of that name, recorded or
// not: the name is reserved for every tool of the layer. A schema that is
// not a plain object schema, or that the SDK would refuse, is left as it
// is (for mcp.AddTool to report); replays of such a tool carry the note in
// content only.
func outputSchemaWithNote[Out any](t *mcp.Tool, record bool) (*mcp.Tool, outputSchemaOf[Out], error) {
	var res outputSchemaOf[Out]
	schema := t.OutputSchema
	var inferredElem reflect.Type
	if schema == nil {
		rt := reflect.TypeFor[Out]()
		if rt == reflect.TypeFor[any]() {
			// No output schema: structured content is free-form.
			res.noteAdvertised = true
			return t, res, nil
		}
		if rt.Kind() == reflect.Pointer {
			rt = rt.Elem()
			inferredElem = rt
		}
		inferred, err := jsonschema.ForType(rt, &jsonschema.ForOptions{})
		if err != nil {
			return t, res, nil
		}
		schema = inferred
	}
	b, ok := schema.(json.RawMessage)
	if !ok {
		var err error
		if b, err = json.Marshal(schema); err != nil {
			return t, res, nil
		}
	}
	amended, err := replaynote.Amend(b)
	switch {
	case errors.Is(err, replaynote.ErrDeclared):
		return t, res, fmt.Errorf("%w; rename the tool's output field", err)
	case err != nil || !record:
		return t, res, nil
	}
	tt := *t
	tt.OutputSchema = json.RawMessage(amended)
	res.noteAdvertised = true
	res.zeroElem = inferredElem
	return &tt, res, nil
}

// replayNote is the note a replayed or joined result carries: it tells
// the model that the tool did not run for this call, and what the result
// is.
func replayNote(r callRow, a *attempt) string {
	id := a.id
	when := time.UnixMilli(r.completedAt.Int64).UTC().Format(time.RFC3339Nano)
	var note string
	if a.outcome == outcomeJoined {
		// The retry arrived while an earlier attempt ran the call, waited,
		// and got its result: nothing was replayed from an old record.
		which := fmt.Sprintf("the call with idempotency key %q", id.key)
		if keyless(id) {
			which = "an identical call (same tool and arguments, no idempotency key)"
		}
		note = fmt.Sprintf("[mcp-outbox] Joined: an earlier attempt of %s was still running when this call arrived; "+
			"this is that attempt's result (it %s at %s). The tool ran once, not again for this call.",
			which, r.state, when)
	} else {
		var which string
		if keyless(id) {
			which = fmt.Sprintf("an identical call (same tool and arguments, no idempotency key) first made at %s",
				time.UnixMilli(r.createdAt).UTC().Format(time.RFC3339))
		} else {
			which = fmt.Sprintf("the call with idempotency key %q", id.key)
		}
		note = fmt.Sprintf("[mcp-outbox] Replayed: this is the recorded result of %s, which %s at %s. The tool did not run again.",
			which, r.state, when)
	}
	if keyless(id) {
		// A client that sent no key may never have heard of keys: tell
		// it what makes its next identical call a new one.
		note += fmt.Sprintf(" Identical calls without a key replay it until %s; after that, an identical call runs as a new call. "+
			"A call that carries an idempotency key is told apart by its key.",
			time.UnixMilli(r.expiresAt).UTC().Format(time.RFC3339))
	}
	return note
}
