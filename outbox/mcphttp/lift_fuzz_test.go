package mcphttp

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
)

// liftSeeds are JSON-RPC messages and bodies as clients send them, with
// the shapes a lift can trip over: _meta null or not an object, the key
// not a string, batches, duplicate keys, a BOM, CRLF, invalid UTF-8.
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
	`[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"x","idempotencyKey":"b"}}]`,
	`[]`,
	"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"idempotencyKey\":\"k\"}}",
	"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"\xff\",\"idempotencyKey\":\"\xfe\"}}\r\n",
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"n":1e400},"idempotencyKey":"k"}}`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"<&>","idempotencyKey":"\u2028"}}`,
	``,
	`{"jsonrpc":`,
}

// FuzzLiftBody checks the Streamable HTTP lift (LiftParamsKey's body
// rewrite): a body is reported unchanged (and passed on as it came) only
// when no message in it needed a lift, and otherwise becomes valid JSON in
// which every message and every params member is the same JSON value as
// before, except that _meta of the messages that needed one gained exactly
// the members wantMeta says, and kept every other.
func FuzzLiftBody(f *testing.F) {
	for _, s := range liftSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in := bytes.Clone(body)
		out, changed := liftBody(body)
		if !bytes.Equal(body, in) {
			t.Fatalf("liftBody wrote into its input")
		}
		if !changed {
			checkUnlifted(t, in) // LiftParamsKey passes the body on as it came
			return
		}
		if !json.Valid(out) {
			t.Fatalf("liftBody(%q) = %q, not JSON", in, out)
		}
		trimmed := bytes.TrimSpace(in)
		if trimmed[0] != '[' {
			checkLifted(t, trimmed, out)
			return
		}
		var before, after []json.RawMessage
		if json.Unmarshal(trimmed, &before) != nil || json.Unmarshal(out, &after) != nil || len(before) != len(after) {
			t.Fatalf("batch %q became %q", in, out)
		}
		for i := range before {
			checkLifted(t, before[i], after[i])
		}
	})
}

// checkUnlifted fails when a body the lift left alone holds a message
// that needed a lift.
func checkUnlifted(t *testing.T, body []byte) {
	t.Helper()
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return
	}
	msgs := []json.RawMessage{trimmed}
	if trimmed[0] == '[' && json.Unmarshal(trimmed, &msgs) != nil {
		return // not a batch: the SDK's to refuse
	}
	for _, m := range msgs {
		var msg map[string]json.RawMessage
		if json.Unmarshal(m, &msg) != nil {
			continue
		}
		if want := wantMeta(msg); want != nil {
			t.Fatalf("body %q passed on unchanged, but its message %q needed _meta %q", body, m, want)
		}
	}
}

// wantMeta is what the lift (liftMessage) must set in a message's
// params._meta, member by member, or nil when it must leave the message
// alone. It restates the rules of lift.go and paramskey per method:
//
//   - tools/call: params.idempotencyKey, even null, under
//     paramskey.MetaKey, and a params.task that is not null under
//     paramskey.TaskMetaKey;
//   - initialize: true under paramskey.FrontMetaKey, params absent or
//     null counting as {};
//   - subscriptions/listen with an id (even null): {"id": id, "taskIds":
//     params.notifications.taskIds} under paramskey.ListenMetaKey, when
//     notifications is an object with taskIds.
//
// In every case params must be an object and its _meta absent, null or an
// object: anything else is the SDK's to refuse. Any other method is left
// alone.
func wantMeta(msg map[string]json.RawMessage) map[string]json.RawMessage {
	var method string
	if json.Unmarshal(msg["method"], &method) != nil {
		return nil
	}
	var p map[string]json.RawMessage
	params, hasParams := msg["params"]
	if method == "initialize" && (!hasParams || isNull(params)) {
		p = map[string]json.RawMessage{}
	} else if json.Unmarshal(params, &p) != nil || p == nil {
		return nil
	}
	if meta, ok := p["_meta"]; ok {
		var m map[string]json.RawMessage
		if json.Unmarshal(meta, &m) != nil {
			return nil
		}
	}
	set := map[string]json.RawMessage{}
	switch method {
	case "tools/call":
		if key, ok := p["idempotencyKey"]; ok {
			set[paramskey.MetaKey] = key
		}
		if task, ok := p["task"]; ok && !isNull(task) {
			set[paramskey.TaskMetaKey] = task
		}
	case "initialize":
		set[paramskey.FrontMetaKey] = json.RawMessage(`true`)
	case "subscriptions/listen":
		id, hasID := msg["id"]
		var n map[string]json.RawMessage
		if !hasID || json.Unmarshal(p["notifications"], &n) != nil {
			return nil
		}
		ids, ok := n["taskIds"]
		if !ok {
			return nil
		}
		v, err := json.Marshal(map[string]json.RawMessage{"id": id, "taskIds": ids})
		if err != nil {
			return nil
		}
		set[paramskey.ListenMetaKey] = v
	}
	if len(set) == 0 {
		return nil
	}
	return set
}

// isNull reports whether v is the JSON null.
func isNull(v json.RawMessage) bool {
	x, err := decodeExact(v)
	return err == nil && x == nil
}

// checkLifted compares one message before and after the lift.
func checkLifted(t *testing.T, before, after json.RawMessage) {
	t.Helper()
	var b, a map[string]json.RawMessage
	if json.Unmarshal(before, &b) != nil {
		if !jsonEqual(before, after) {
			t.Fatalf("a message that is not an object changed: %q to %q", before, after)
		}
		return
	}
	if err := json.Unmarshal(after, &a); err != nil {
		t.Fatalf("message %q became %q: %v", before, after, err)
	}
	want := wantMeta(b)
	lifted := want != nil
	for k := range union(a, b) {
		if k == "params" && lifted {
			continue
		}
		if !jsonEqual(a[k], b[k]) {
			t.Fatalf("member %q of %q changed to %q", k, before, after)
		}
	}
	if !lifted {
		return
	}
	var bp, ap map[string]json.RawMessage
	_ = json.Unmarshal(b["params"], &bp)
	if err := json.Unmarshal(a["params"], &ap); err != nil || ap == nil {
		t.Fatalf("params of %q became %q", before, after)
	}
	for k := range union(ap, bp) {
		if k != "_meta" && !jsonEqual(ap[k], bp[k]) {
			t.Fatalf("params member %q of %q changed in %q", k, before, after)
		}
	}
	var bm, am map[string]json.RawMessage
	_ = json.Unmarshal(bp["_meta"], &bm)
	if err := json.Unmarshal(ap["_meta"], &am); err != nil || am == nil {
		t.Fatalf("_meta of %q became %q", before, after)
	}
	keys := union(am, bm)
	for k := range want {
		keys[k] = true // a member to set that is missing fails
	}
	for k := range keys {
		w, set := want[k]
		if !set {
			w = bm[k]
		}
		if !jsonEqual(am[k], w) {
			t.Fatalf("_meta member %q of %q is %q in %q, want %q", k, before, am[k], after, w)
		}
	}
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

// jsonEqual reports whether a and b are the same JSON value as Go reads
// it: member order, white space and escapes aside, numbers as written. Two
// absent values are equal.
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
