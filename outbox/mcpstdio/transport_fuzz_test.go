package mcpstdio

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"reflect"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/cancelnote"
	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
)

// liftSeeds are messages as the SDK's transport decodes them, with the
// shapes a lift can trip over: _meta null or not an object, the key not a
// string, params null, duplicate keys, another method.
var liftSeeds = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"amount":100},"idempotencyKey":"order-1"}}`,
	`{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"charge","_meta":{"progressToken":7,"idempotencyKey":"m"},"idempotencyKey":"p"}}`,
	`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"charge","_meta":null,"idempotencyKey":"k"}}`,
	`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"charge","_meta":[1],"idempotencyKey":"k"}}`,
	`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"charge","idempotencyKey":null}}`,
	`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"charge","idempotencyKey":18446744073709551617}}`,
	`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"charge","idempotencyKey":"a","idempotencyKey":"b"}}`,
	`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":null}`,
	`{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"idempotencyKey":"k"}}`,
	`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	`{"jsonrpc":"2.0","id":9,"result":{"idempotencyKey":"k"}}`,
}

// fakeConn hands out one message, then EOF.
type fakeConn struct{ msg jsonrpc.Message }

func (c *fakeConn) Read(context.Context) (jsonrpc.Message, error) {
	if c.msg == nil {
		return nil, io.EOF
	}
	m := c.msg
	c.msg = nil
	return m, nil
}
func (c *fakeConn) Write(context.Context, jsonrpc.Message) error { return nil }
func (c *fakeConn) Close() error                                 { return nil }
func (c *fakeConn) SessionID() string                            { return "" }

type fakeTransport struct{ conn *fakeConn }

func (t fakeTransport) Connect(context.Context) (mcp.Connection, error) { return t.conn, nil }

// FuzzNewTransport checks the lift on the message the SDK decoded:
// NewTransport's connection never fails or panics on a message, hands on
// the message it read, changes nothing but the params of the requests
// it lifts, and there gives exactly what paramskey gives for the method
// (besides a tools/call's request handle): LiftCall for tools/call, with
// the key under paramskey.MetaKey and a task under paramskey.TaskMetaKey;
// MarkFront for initialize, with true under paramskey.FrontMetaKey;
// LiftListen with the request's id for subscriptions/listen, under
// paramskey.ListenMetaKey. That the lift keeps every other member of
// params and _meta is mcphttp's FuzzLiftBody's to check: it drives the
// same functions.
func FuzzNewTransport(f *testing.F) {
	for _, s := range liftSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		msg, err := jsonrpc.DecodeMessage(line)
		if err != nil {
			return // the SDK's transport refuses it before the lift
		}
		before, err := jsonrpc.EncodeMessage(msg)
		if err != nil {
			t.Skip("the SDK cannot encode what it decoded")
		}
		req, _ := msg.(*jsonrpc.Request)
		var params, want json.RawMessage
		lifts := false // whether the connection may change req.Params
		if req != nil {
			params = bytes.Clone(req.Params)
			switch req.Method {
			case "tools/call":
				want, _ = paramskey.LiftCall(params)
				lifts = true
			case "initialize":
				want, _ = paramskey.MarkFront(params)
				lifts = true
			case "subscriptions/listen":
				want = params
				if req.ID.IsValid() {
					want, _ = paramskey.LiftListen(requestID(t, before), params)
				}
				lifts = true
			}
		}
		conn, err := NewTransport(fakeTransport{&fakeConn{msg: msg}}, nil).Connect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got, err := conn.Read(context.Background())
		if err != nil {
			t.Fatalf("Read(%q): %v", line, err)
		}
		if got != msg {
			t.Fatalf("Read(%q) handed on another message than it read", line)
		}
		if lifts {
			gotParams := decodeParams(req.Params)
			if req.Method == "tools/call" {
				gotParams = withoutHandle(t, req.Params, req.IsCall())
			}
			if !reflect.DeepEqual(withoutNullMeta(gotParams), withoutNullMeta(decodeParams(want))) {
				t.Fatalf("params of %q became %q, want %q (and a tools/call request's handle)", line, req.Params, want)
			}
			checkMeta(t, line, params, req.Params, req.Method, requestID(t, before))
			req.Params = params // for the comparison of the rest
		}
		after, err := jsonrpc.EncodeMessage(got)
		if err != nil {
			t.Fatalf("lifted message of %q does not encode: %v", line, err)
		}
		if !bytes.Equal(before, after) {
			t.Fatalf("message %q changed beyond params: %q", before, after)
		}
		if _, err := conn.Read(context.Background()); err != io.EOF {
			t.Fatalf("second Read: %v, want EOF", err)
		}
	})
}

// requestID is the id of the encoded message msg, as the SDK writes it:
// nil when it has none.
func requestID(t *testing.T, msg []byte) json.RawMessage {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		t.Fatalf("encoded message %q: %v", msg, err)
	}
	return m.ID
}

// checkMeta checks, apart from paramskey, that the lift of a request with
// method put in _meta of lifted what it had to, when it lifted at all (a
// changed params): for tools/call the idempotencyKey of params, even null,
// under paramskey.MetaKey and a task that is not null under
// paramskey.TaskMetaKey; for initialize true under paramskey.FrontMetaKey;
// for subscriptions/listen the id and notifications.taskIds under
// paramskey.ListenMetaKey.
func checkMeta(t *testing.T, line []byte, params, lifted json.RawMessage, method string, id json.RawMessage) {
	t.Helper()
	var in, out, meta map[string]json.RawMessage
	if json.Unmarshal(lifted, &out) != nil || json.Unmarshal(out["_meta"], &meta) != nil || meta == nil {
		return // not lifted: whether it had to be, the comparison with paramskey tells
	}
	_ = json.Unmarshal(params, &in)
	want := map[string]any{}
	switch method {
	case "tools/call":
		if key, ok := in["idempotencyKey"]; ok {
			want[paramskey.MetaKey] = decodeParams(key)
		}
		if task, ok := in["task"]; ok && decodeParams(task) != nil {
			want[paramskey.TaskMetaKey] = decodeParams(task)
		}
	case "initialize":
		want[paramskey.FrontMetaKey] = true
	case "subscriptions/listen":
		var n map[string]json.RawMessage
		_ = json.Unmarshal(in["notifications"], &n)
		if ids, ok := n["taskIds"]; ok && id != nil {
			want[paramskey.ListenMetaKey] = map[string]any{"id": decodeParams(id), "taskIds": decodeParams(ids)}
		}
	}
	for k, w := range want {
		v, ok := meta[k]
		if !ok || !reflect.DeepEqual(decodeParams(v), w) {
			t.Fatalf("params of %q became %q: _meta[%q] is %s, want %v", line, lifted, k, v, w)
		}
	}
}

// decodeParams decodes params for a comparison by value: the lift and the
// handle re-encode them (keys sorted, spaces gone).
func decodeParams(params json.RawMessage) any {
	d := json.NewDecoder(bytes.NewReader(params))
	d.UseNumber() // exact: 18446744073709551617 stays itself
	var v any
	if d.Decode(&v) != nil {
		return string(params)
	}
	return v
}

// withoutHandle decodes params without the handle the connection adds to
// _meta of a tools/call request (cancelnote.MetaKey), which must be there,
// as a string, when params are an object and the message has an id (a
// tools/call without one is a notification, which nobody can cancel).
func withoutHandle(t *testing.T, params json.RawMessage, request bool) any {
	v := decodeParams(params)
	p, ok := v.(map[string]any)
	if !ok {
		return v
	}
	meta, _ := p["_meta"].(map[string]any)
	if _, ok := meta[cancelnote.MetaKey].(string); !ok {
		if _, isObject := p["_meta"].(map[string]any); request && (isObject || p["_meta"] == nil) {
			t.Fatalf("params %s: no request handle under _meta[%q]", params, cancelnote.MetaKey)
		}
		return v // _meta is not an object: left for the SDK to refuse
	}
	delete(meta, cancelnote.MetaKey)
	if len(meta) == 0 {
		delete(p, "_meta") // the handle was all of it
	}
	return p
}

// withoutNullMeta drops a "_meta" that is null or {}: the handle replaces
// a null one and fills an empty one, and withoutHandle cannot tell either
// from a _meta that was absent.
func withoutNullMeta(v any) any {
	if p, ok := v.(map[string]any); ok {
		if m, present := p["_meta"]; present {
			if obj, isObject := m.(map[string]any); m == nil || (isObject && len(obj) == 0) {
				delete(p, "_meta")
			}
		}
	}
	return v
}
