package sidecar

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/schemacheck"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// typedUpstream is a go-sdk server whose tools have typed outputs, so
// output schemas with additionalProperties false, as go-sdk, zod and
// pydantic (extra="forbid") write them.
type typedUpstream struct{ runs atomic.Int64 }

type receiptOut struct {
	Receipt int64  `json:"receipt"`
	Memo    string `json:"memo"`
}

func (u *typedUpstream) Dial(ctx context.Context) (mcp.Connection, error) {
	s := mcp.NewServer(&mcp.Implementation{Name: "typed", Version: "v0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "pay"}, func(ctx context.Context, _ *mcp.CallToolRequest, in workIn) (*mcp.CallToolResult, receiptOut, error) {
		return nil, receiptOut{Receipt: u.runs.Add(1), Memo: "paid"}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "peek", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, _ *mcp.CallToolRequest, in workIn) (*mcp.CallToolResult, receiptOut, error) {
			return nil, receiptOut{}, nil
		})
	ct, st := mcp.NewInMemoryTransports()
	if _, err := s.Connect(ctx, st, nil); err != nil {
		return nil, err
	}
	return ct.Connect(ctx)
}

func (u *typedUpstream) String() string { return "typed upstream" }

// Through the proxy, the output schema of a recorded upstream tool lists
// the replay note, and a replay carries it in its structured content,
// valid against that schema; a read-only tool's schema is the upstream's.
func TestReplayNoteThroughProxy(t *testing.T) {
	u := &typedUpstream{}
	cs := connect2(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	schemas := map[string]string{}
	for _, tl := range tools.Tools {
		b, _ := json.Marshal(tl.OutputSchema)
		schemas[tl.Name] = string(b)
	}
	pay := schemas["pay"]
	if !strings.Contains(pay, `"additionalProperties":false`) || !strings.Contains(pay, `"`+outbox.ReplayNoteProperty+`":{"description":`) {
		t.Fatalf("pay's output schema through the proxy: %s, want the upstream's with the note's property", pay)
	}
	if err := schemacheck.Strict(json.RawMessage(pay)); err != nil {
		t.Errorf("pay's schema: %v", err)
	}
	if strings.Contains(schemas["peek"], outbox.ReplayNoteProperty) {
		t.Errorf("a read-only tool's schema changed: %s", schemas["peek"])
	}
	var s jsonschema.Schema
	if err := json.Unmarshal([]byte(pay), &s); err != nil {
		t.Fatal(err)
	}
	resolved, err := s.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	valid := func(res *mcp.CallToolResult) (map[string]any, error) {
		b, _ := json.Marshal(res.StructuredContent)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("structured content %s: %v", b, err)
		}
		return v, resolved.Validate(v)
	}
	p := &mcp.CallToolParams{Name: "pay", Arguments: map[string]any{"n": 1}, Meta: mcp.Meta{outbox.MetaKeyIdempotency: "pay-1"}}
	first, err := cs.CallTool(ctx, p)
	if err != nil || first.IsError {
		t.Fatalf("pay: %v %v", first, err)
	}
	if v, err := valid(first); err != nil || v[outbox.ReplayNoteProperty] != nil {
		t.Errorf("first answer %v (%v): want the upstream's, valid", v, err)
	}
	again, err := cs.CallTool(ctx, p)
	if err != nil || again.IsError {
		t.Fatalf("pay again: %v %v", again, err)
	}
	v, err := valid(again)
	if err != nil {
		t.Errorf("replay against the listed schema: %v", err)
	}
	note, _ := v[outbox.ReplayNoteProperty].(string)
	if !strings.HasPrefix(note, "[mcp-outbox] Replayed: ") || v["receipt"] != float64(1) || u.runs.Load() != 1 {
		t.Errorf("replay %v after %d runs: want receipt 1 with the note", v, u.runs.Load())
	}
}

// connect2 is connect for any Dialer, in front of an upstream that does
// not cooperate.
func connect2(t *testing.T, up Dialer) *mcp.ClientSession {
	t.Helper()
	cs, _ := proxyTo(t, false, up, nil, nil)
	return cs
}
