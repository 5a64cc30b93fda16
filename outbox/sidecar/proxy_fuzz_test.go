package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/remote"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// paramsSeeds are tools/call params as clients send them, and the shapes
// a rewrite can get wrong: _meta null or not an object, a claim the client
// forged, numbers no float64 holds, keys that differ only in case,
// duplicate keys, invalid UTF-8.
var paramsSeeds = []string{
	`{"name":"charge","arguments":{"amount":100}}`,
	`{"name":"charge","arguments":{"amount":100},"_meta":{"idempotencyKey":"k-1","progressToken":7}}`,
	`{"name":"charge","_meta":null}`,
	`{"name":"charge","_meta":[]}`,
	`{"name":"charge","_meta":{"io.github.mcp-outbox/claim":{"owner":"forged"}}}`,
	`{"name":"charge","arguments":{"amount":18446744073709551617,"rate":1.10,"tiny":1e-400}}`,
	`{"name":"charge","Name":"look"}`,
	`{"name":"charge","_META":{"idempotencyKey":"x"}}`,
	`{"name":"a","name":"charge"}`,
	`{"name":"charge","extra":{"nested":[null,true,"<&>"]},"requestState":"s"}`,
	"{\"name\":\"\xff\",\"\xfe\":1}",
	`{}`,
	`null`,
	`[]`,
	`"charge"`,
}

// FuzzWithClaim checks the claim's way into a forwarded call: every params
// member but _meta, and every _meta member but the claim, reaches the
// upstream as the same JSON value (numbers as written), and the claim is
// the proxy's, whatever the client put there.
func FuzzWithClaim(f *testing.F) {
	for _, s := range paramsSeeds {
		f.Add([]byte(s))
	}
	claim := &remote.Claim{Key: "k-1", CallID: "call_0123", RowID: 42, Owner: "att_1"}
	wantClaim, _ := json.Marshal(claim)
	f.Fuzz(func(t *testing.T, params []byte) {
		out, err := withClaim(params, claim)
		var in map[string]json.RawMessage
		inErr := json.Unmarshal(params, &in)
		if err != nil {
			if inErr == nil && in != nil {
				var meta map[string]json.RawMessage
				if json.Unmarshal(in["_meta"], &meta) == nil || in["_meta"] == nil {
					t.Fatalf("withClaim(%q) refused an object with an object _meta: %v", params, err)
				}
			}
			return
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("withClaim(%q) = %q, not an object: %v", params, out, err)
		}
		for k := range union(in, got) {
			if k != "_meta" && !jsonEqual(in[k], got[k]) {
				t.Fatalf("withClaim(%q) = %q: member %q changed", params, out, k)
			}
		}
		var inMeta, gotMeta map[string]json.RawMessage
		_ = json.Unmarshal(in["_meta"], &inMeta)
		if err := json.Unmarshal(got["_meta"], &gotMeta); err != nil {
			t.Fatalf("withClaim(%q) = %q: _meta: %v", params, out, err)
		}
		for k := range union(inMeta, gotMeta) {
			want := inMeta[k]
			if k == remote.MetaKeyClaim {
				want = wantClaim
			}
			if !jsonEqual(want, gotMeta[k]) {
				t.Fatalf("withClaim(%q) = %q: _meta member %q is %q, want %q", params, out, k, gotMeta[k], want)
			}
		}
	})
}

// FuzzCallParams checks that the proxy and the upstream read one call: the
// tool name, arguments and _meta the proxy records a call under are the
// ones the upstream gets, as an upstream in another language reads them
// (exact member names, the last of duplicates). Params the two would read
// differently are refused.
func FuzzCallParams(f *testing.F) {
	for _, s := range paramsSeeds {
		f.Add([]byte(s))
	}
	claim := &remote.Claim{Key: "k", CallID: "call_1", RowID: 1, Owner: "o"}
	f.Fuzz(func(t *testing.T, raw []byte) {
		params, err := decodeCallParams(raw)
		if err != nil {
			return // answered with an invalid params error
		}
		out, err := withClaim(raw, claim)
		if err != nil {
			return // not forwarded: the layer records it as not run
		}
		var exact map[string]json.RawMessage
		if err := json.Unmarshal(out, &exact); err != nil {
			t.Fatalf("forwarded params %q are not an object", out)
		}
		var name string
		if err := json.Unmarshal(exact["name"], &name); err != nil || name != params.Name {
			t.Fatalf("params %q: the proxy records tool %q, the upstream reads %q (%v)", raw, params.Name, exact["name"], err)
		}
		if !jsonEqual(exact["arguments"], params.Arguments) && !(exact["arguments"] == nil && len(params.Arguments) == 0) {
			t.Fatalf("params %q: the proxy hashes arguments %q, the upstream reads %q", raw, params.Arguments, exact["arguments"])
		}
		// The keys in _meta (strings; other values the proxy does not read).
		var meta map[string]json.RawMessage
		_ = json.Unmarshal(exact["_meta"], &meta)
		for k, v := range params.Meta {
			var up string
			if s, ok := v.(string); ok && k != remote.MetaKeyClaim && (json.Unmarshal(meta[k], &up) != nil || up != s) {
				t.Fatalf("params %q: _meta %q is %q to the proxy, %q to the upstream", raw, k, s, meta[k])
			}
		}
	})
}

// FuzzCancelNotification checks the cancel passed on for a forwarded
// request: under the proxy's id, with everything else the client said.
func FuzzCancelNotification(f *testing.F) {
	for _, s := range []string{
		`{"requestId":3,"reason":"user"}`, `{"requestId":"abc"}`, `{}`, `null`, `[]`, `{"reason":{"big":18446744073709551617}}`,
		`{"requestId":1,"requestId":2}`, "{\"reason\":\"\xff\"}", `{"_meta":{"k":1.50}}`,
	} {
		f.Add(int64(7), []byte(s))
	}
	f.Fuzz(func(t *testing.T, upID int64, params []byte) {
		m := cancelNotification(upID, params)
		if m.Method != "notifications/cancelled" || m.IsCall() {
			t.Fatalf("not a cancel notification: %+v", m)
		}
		var got, in map[string]json.RawMessage
		if err := json.Unmarshal(m.Params, &got); err != nil {
			t.Fatalf("params %q: %v", m.Params, err)
		}
		var id int64
		if err := json.Unmarshal(got["requestId"], &id); err != nil || id != upID {
			t.Fatalf("requestId %q, want %d", got["requestId"], upID)
		}
		if json.Unmarshal(params, &in) != nil {
			return
		}
		for k := range union(in, got) {
			if k != "requestId" && !jsonEqual(in[k], got[k]) {
				t.Fatalf("cancel params %q became %q: member %q changed", params, m.Params, k)
			}
		}
	})
}

// fuzzSession is a session with a proxy in front of nothing, enough for the
// result rewrites.
func fuzzSession(f *testing.F) *session {
	db, err := schema.Open(context.Background(), filepath.Join(f.TempDir(), "proxy.db"), &schema.Options{Durability: schema.DurabilityNormal})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	layer, err := outbox.New(db, nil)
	if err != nil {
		f.Fatal(err)
	}
	p, err := New(Options{Layer: layer, Upstream: &fuzzUpstream{}})
	if err != nil {
		f.Fatal(err)
	}
	return &session{p: p}
}

// FuzzRewriteCapabilities checks the initialize (and server/discover)
// result the client gets: the upstream's, member for member and number for
// number, with tools and the layer's capability added.
func FuzzRewriteCapabilities(f *testing.F) {
	for _, s := range []string{
		`{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true},"resources":{}},"serverInfo":{"name":"up","version":"1.0"}}`,
		`{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"up","version":"1"}}`,
		`{"capabilities":{"experimental":{"other":{"n":1.0}},"tools":true}}`,
		`{"capabilities":null}`,
		`{"capabilities":[]}`,
		`{"capabilities":{"experimental":null,"logging":{}}}`,
		`{"_meta":{"big":18446744073709551617,"f":1.10},"instructions":"<b>&</b>"}`,
		"{\"serverInfo\":{\"name\":\"\xff\"}}",
		`{"a":1,"a":2}`,
		`{}`, `null`, `[]`, `1`,
	} {
		f.Add([]byte(s))
	}
	s := fuzzSession(f)
	capability, _ := json.Marshal(remote.Of(s.p.opts.Layer).Capability())
	f.Fuzz(func(t *testing.T, result []byte) {
		out, err := s.rewriteCapabilities(result)
		var in map[string]json.RawMessage
		if json.Unmarshal(result, &in) != nil || in == nil {
			if err == nil {
				t.Fatalf("rewriteCapabilities(%q) = %q, want an error for a result that is not an object", result, out)
			}
			return
		}
		if err != nil {
			t.Fatalf("rewriteCapabilities(%q): %v", result, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("rewriteCapabilities(%q) = %q, not an object", result, out)
		}
		for k := range union(in, got) {
			if k != "capabilities" && !jsonEqual(in[k], got[k]) {
				t.Fatalf("rewriteCapabilities(%q) = %q: member %q changed", result, out, k)
			}
		}
		var inCaps, gotCaps map[string]json.RawMessage
		_ = json.Unmarshal(in["capabilities"], &inCaps)
		if err := json.Unmarshal(got["capabilities"], &gotCaps); err != nil {
			t.Fatalf("capabilities %q: %v", got["capabilities"], err)
		}
		var tools map[string]json.RawMessage
		if json.Unmarshal(gotCaps["tools"], &tools) != nil || tools == nil {
			t.Fatalf("capabilities.tools %q: not an object", gotCaps["tools"])
		}
		if json.Unmarshal(inCaps["tools"], new(map[string]json.RawMessage)) == nil && inCaps["tools"] != nil && string(inCaps["tools"]) != "null" &&
			!jsonEqual(inCaps["tools"], gotCaps["tools"]) {
			t.Fatalf("capabilities.tools %q became %q", inCaps["tools"], gotCaps["tools"])
		}
		for k := range union(inCaps, gotCaps) {
			if k != "tools" && k != "experimental" && !jsonEqual(inCaps[k], gotCaps[k]) {
				t.Fatalf("capabilities member %q changed: %q to %q", k, inCaps[k], gotCaps[k])
			}
		}
		var inExp, gotExp map[string]json.RawMessage
		_ = json.Unmarshal(inCaps["experimental"], &inExp)
		if err := json.Unmarshal(gotCaps["experimental"], &gotExp); err != nil {
			t.Fatalf("experimental %q: %v", gotCaps["experimental"], err)
		}
		for k := range union(inExp, gotExp) {
			want := inExp[k]
			if k == outbox.CapabilityName {
				want = capability
			}
			if !jsonEqual(want, gotExp[k]) {
				t.Fatalf("experimental %q is %q, want %q", k, gotExp[k], want)
			}
		}
	})
}

// FuzzRewriteToolsList checks the tools/list result the client gets: the
// upstream's tools in order and unchanged, every other member unchanged,
// and the status tool, once, on the last page only.
func FuzzRewriteToolsList(f *testing.F) {
	for _, s := range []string{
		`{"tools":[{"name":"charge","inputSchema":{"type":"object"}},{"name":"look","annotations":{"readOnlyHint":true}}]}`,
		`{"tools":[{"name":"charge","inputSchema":{"type":"object"}}],"nextCursor":"page2"}`,
		`{"tools":[],"nextCursor":""}`,
		`{"tools":null}`,
		`{}`,
		`{"tools":[{"name":"call_status","description":"the upstream's own"}]}`,
		`{"tools":[1,"x",null,{"name":7},{"name":"n","inputSchema":{"maximum":18446744073709551617}}]}`,
		`{"tools":[],"nextCursor":5,"_meta":{"f":1.50}}`,
		`{"tools":{}}`,
		"{\"tools\":[{\"name\":\"\xff\"}]}",
		`null`, `[]`,
	} {
		f.Add([]byte(s))
	}
	s := fuzzSession(f)
	f.Fuzz(func(t *testing.T, result []byte) {
		out, err := s.rewriteToolsList(result)
		var in map[string]json.RawMessage
		if json.Unmarshal(result, &in) != nil || in == nil {
			if err == nil {
				t.Fatalf("rewriteToolsList(%q) = %q, want an error", result, out)
			}
			return
		}
		var inTools []json.RawMessage
		if in["tools"] != nil && json.Unmarshal(in["tools"], &inTools) != nil {
			if err == nil {
				t.Fatalf("rewriteToolsList(%q) = %q, want an error for tools that are not an array", result, out)
			}
			return
		}
		if err != nil {
			t.Fatalf("rewriteToolsList(%q): %v", result, err)
		}
		var got map[string]json.RawMessage
		var gotTools []json.RawMessage
		if json.Unmarshal(out, &got) != nil || json.Unmarshal(got["tools"], &gotTools) != nil {
			t.Fatalf("rewriteToolsList(%q) = %q", result, out)
		}
		for k := range union(in, got) {
			if k != "tools" && !jsonEqual(in[k], got[k]) {
				t.Fatalf("rewriteToolsList(%q) = %q: member %q changed", result, out, k)
			}
		}
		var cursor string
		_ = json.Unmarshal(in["nextCursor"], &cursor)
		// The upstream's tools, but one of the status tool's name: the
		// proxy answers that name itself.
		var kept []json.RawMessage
		for _, raw := range inTools {
			var tool struct {
				Name string `json:"name"`
			}
			if json.Unmarshal(raw, &tool) == nil && tool.Name == outbox.StatusToolName {
				continue
			}
			kept = append(kept, raw)
		}
		if cursor == "" {
			status, _ := json.Marshal(remote.Of(s.p.opts.Layer).StatusTool())
			kept = append(kept, status)
		}
		if len(kept) != len(gotTools) {
			t.Fatalf("rewriteToolsList(%q) = %q: %d tools, want %d", result, out, len(gotTools), len(kept))
		}
		for i := range kept {
			if !jsonEqual(kept[i], gotTools[i]) {
				t.Fatalf("rewriteToolsList(%q) = %q: tool %d is %q, want %q", result, out, i, gotTools[i], kept[i])
			}
		}
	})
}

func union(a, b map[string]json.RawMessage) map[string]bool {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return keys
}

// jsonEqual reports whether a and b are the same JSON value: member order,
// white space and escapes aside, numbers exactly as written. Two absent
// values are equal.
func jsonEqual(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	va, errA := decodeExact(a)
	vb, errB := decodeExact(b)
	return errA == nil && errB == nil && reflect.DeepEqual(va, vb)
}

func decodeExact(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, io.ErrUnexpectedEOF
	}
	return v, nil
}

// fuzzUpstream is an in-process upstream whose tools all answer at once:
// work (recorded) and look (read-only), so that no fuzzed call waits on
// anything but the proxy.
type fuzzUpstream struct{ dials atomic.Int64 }

func (*fuzzUpstream) String() string { return "fuzz upstream" }

func (u *fuzzUpstream) Dial(ctx context.Context) (mcp.Connection, error) {
	u.dials.Add(1)
	s := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "v0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "work"}, func(_ context.Context, _ *mcp.CallToolRequest, in workIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("w", in.N%16)}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "look", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, workIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "looked"}}}, nil, nil
		})
	// A stream, as to a process: messages are encoded on the way, as
	// they are to a real upstream.
	proxySide, serverSide := net.Pipe()
	if _, err := s.Connect(ctx, &mcp.IOTransport{Reader: serverSide, Writer: serverSide}, nil); err != nil {
		return nil, err
	}
	return (&mcp.IOTransport{Reader: proxySide, Writer: proxySide}).Connect(ctx)
}
