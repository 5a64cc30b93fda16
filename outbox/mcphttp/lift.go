package mcphttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
	"github.com/mcp-outbox/mcp-outbox/internal/tasknote"
)

// LiftParamsKey is HTTP middleware for a Streamable HTTP endpoint: it
// lifts a top-level params.idempotencyKey of tools/call requests (SEP-3182)
// in a POST body, a single message or a batch, into a _meta member of the
// layer's own, where the layer finds it: the go-sdk would drop it. It lifts
// params.task (a 2025-11-25 client asking for a task) the same way. Bodies it cannot parse pass through unchanged, for the SDK to
// reject, and a body nested deeper than DefaultMaxDepth is refused with 400 (see
// checkDepth). It also writes a task's status notification, which the layer
// cannot send through go-sdk, as itself (see writer): the layer sends one
// only to a session whose task request came through it.
//
// [NewHandler] applies it already. Wrap it around an endpoint of your own,
// such as an mcp.StreamableHTTPHandler whose getServer picks a server per
// tenant.
func LiftParamsKey(next http.Handler) http.Handler {
	return liftParamsKey(next, DefaultMaxDepth)
}

// liftParamsKey is LiftParamsKey that refuses a body nested deeper than
// maxDepth (none when 0).
func liftParamsKey(next http.Handler, maxDepth int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w = &noteWriter{ResponseWriter: w}
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := readBody(w, r)
		r.Body.Close()
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("request body larger than %d bytes", tooLarge.Limit), http.StatusRequestEntityTooLarge)
			return
		}
		if err != nil {
			http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if maxDepth > 0 {
			if cut := checkDepth(body, maxDepth); cut >= 0 {
				refuseDepth(w, maxDepth, idBeforeCut(body, cut))
				return
			}
		}
		if out, changed := liftBody(body); changed {
			body = out
		}
		r.Body = &bodyBytes{Reader: bytes.NewReader(body), b: body}
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// readBody reads r's body, at most the SDK's own limit (a larger body is
// refused by the SDK anyway, and must not be buffered whole here first),
// into one slice of the size its Content-Length declares: io.ReadAll
// would grow a slice from 512 bytes, allocating about five times a 4 MiB
// body on the way (append grows large slices by a quarter).
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	const limit = mcp.DefaultMaxRequestBodyBytes
	rd := http.MaxBytesReader(w, r.Body, limit)
	cl := r.ContentLength
	if cl > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	if cl <= 0 {
		return io.ReadAll(rd) // unknown length (chunked), or none
	}
	body := make([]byte, cl)
	if _, err := io.ReadFull(rd, body); err != nil {
		return nil, err
	}
	// net/http's server ends a body at its Content-Length; a handler
	// called otherwise may get more.
	var one [1]byte
	n, err := rd.Read(one[:])
	if n == 0 && err == io.EOF {
		return body, nil
	}
	if err != nil && err != io.EOF {
		return nil, err
	}
	rest, err := io.ReadAll(rd)
	return append(append(body, one[:n]...), rest...), err
}

// bodyBytes is the body LiftParamsKey passes on, read: the cancels
// wrapper behind it takes the bytes instead of reading a copy.
type bodyBytes struct {
	*bytes.Reader
	b []byte
}

func (*bodyBytes) Close() error { return nil }

// refuseDepth answers a body nested too deep: 400 with the JSON-RPC error
// for an invalid request, under the request's id when one comes before
// the overflow (idBeforeCut), else null.
func refuseDepth(w http.ResponseWriter, max int, id json.RawMessage) {
	msg := fmt.Sprintf("request body nests objects and arrays deeper than %d levels, this server's limit "+
		"(mcphttp.Options.MaxDepth; mcp-outbox serve and proxy keep the default, %d)", max, DefaultMaxDepth)
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": codeInvalidRequest, "message": msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	w.Write(b)
}

// codeInvalidRequest is JSON-RPC's "Invalid Request".
const codeInvalidRequest = -32600

// liftBody lifts the members of each message in body (a message, or a
// batch of them) that need it, by splicing them into the message's
// params._meta: the body is scanned, not decoded (scan.go), and a body
// none of whose messages needs a lift comes back as it is, nothing
// allocated. A lift is kept only when the body is valid JSON.
func liftBody(body []byte) ([]byte, bool) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return body, false
	}
	var edits []splice
	for _, sp := range messageSpans(trimmed) {
		edits = append(edits, messageEdits(trimmed, sp.start, sp.end)...)
	}
	if len(edits) == 0 || !json.Valid(trimmed) {
		return body, false
	}
	return apply(trimmed, edits), true
}

// member is one member a lift sets in _meta.
type member struct {
	key   string // plain ASCII, written as it is
	value []byte // JSON, as the client wrote it
}

// messageEdits returns the edits of b that lift the message b[start:end]:
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
// params must be an object, and its _meta absent, null or an object:
// anything else is the SDK's to refuse. Where a member repeats, the last
// one counts, as for the decoders.
func messageEdits(b []byte, start, end int) []splice {
	m := b[start:end]
	sp, ok := fields(m, "method", "params", "id")
	if !ok || !sp[0].ok() {
		return nil
	}
	method, params := sp[0].of(m), sp[1]
	at := start + params.start // where params starts in b
	switch {
	case stringIs(method, "tools/call"):
		if !params.ok() {
			return nil
		}
		ps, ok := fields(params.of(m), "idempotencyKey", "task", "_meta")
		if !ok {
			return nil
		}
		var set []member
		if ps[0].ok() {
			set = append(set, member{paramskey.MetaKey, ps[0].of(params.of(m))})
		}
		if ps[1].ok() && !isNullValue(ps[1].of(params.of(m))) {
			set = append(set, member{paramskey.TaskMetaKey, ps[1].of(params.of(m))})
		}
		return metaEdits(params.of(m), at, ps[2], set)
	case stringIs(method, "initialize"):
		set := []member{{paramskey.FrontMetaKey, []byte("true")}}
		if !params.ok() {
			// After the message's '{': it has a member, its method.
			return []splice{{start + 1, start + 1, append(append([]byte(`"params":{"_meta":`), metaObject(set)...), "},"...)}}
		}
		if isNullValue(params.of(m)) {
			return []splice{{at, start + params.end, append(append([]byte(`{"_meta":`), metaObject(set)...), '}')}}
		}
		ps, ok := fields(params.of(m), "_meta")
		if !ok {
			return nil
		}
		return metaEdits(params.of(m), at, ps[0], set)
	case stringIs(method, "subscriptions/listen"):
		id := sp[2]
		if !id.ok() || !params.ok() {
			return nil
		}
		p := params.of(m)
		ps, ok := fields(p, "notifications", "_meta")
		if !ok || !ps[0].ok() {
			return nil
		}
		ns, ok := fields(ps[0].of(p), "taskIds")
		if !ok || !ns[0].ok() {
			return nil
		}
		v := append(append(append(append([]byte(`{"id":`), id.of(m)...), `,"taskIds":`...), ns[0].of(ps[0].of(p))...), '}')
		return metaEdits(p, at, ps[1], []member{{paramskey.ListenMetaKey, v}})
	}
	return nil
}

// metaEdits sets the members in the _meta (at meta, absent or not) of the
// params object p, which starts at b[at]. A member goes after any of
// _meta's own: where _meta already has the key, the last one counts.
func metaEdits(p []byte, at int, meta span, set []member) []splice {
	if len(set) == 0 {
		return nil
	}
	if !meta.ok() {
		ins := append([]byte(`"_meta":`), metaObject(set)...)
		if i := skipSpace(p, 1); i < len(p) && p[i] != '}' {
			ins = append(ins, ',')
		}
		return []splice{{at + 1, at + 1, ins}}
	}
	v := meta.of(p)
	if isNullValue(v) {
		return []splice{{at + meta.start, at + meta.end, metaObject(set)}}
	}
	if !members(v, func([]byte, span) {}) {
		return nil // not an object
	}
	ins := metaMembers(set)
	if i := skipSpace(v, 1); v[i] != '}' {
		ins = append([]byte{','}, ins...)
	}
	closing := at + meta.end - 1
	return []splice{{closing, closing, ins}}
}

func metaObject(set []member) []byte {
	return append(append([]byte{'{'}, metaMembers(set)...), '}')
}

func metaMembers(set []member) []byte {
	var out []byte
	for i, m := range set {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(append(append(append(out, '"'), m.key...), `":`...), m.value...)
	}
	return out
}

// noteWriter writes the layer's marker notifications (tasknote) as the
// notifications they stand for. go-sdk writes each Server-Sent Event in
// one Write (writeEvent in its event.go), so an event is rewritten whole.
// A task's notifications/tasks/status of a 2025-11-25 session goes out on
// the session's standalone stream (the client's GET), which is where
// go-sdk puts a notification related to no request.
type noteWriter struct {
	http.ResponseWriter
}

func (w *noteWriter) Write(p []byte) (int, error) {
	out, changed := tasknote.RewriteEvent(p)
	if !changed {
		return w.ResponseWriter.Write(p)
	}
	if _, err := w.ResponseWriter.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush and Unwrap keep http.ResponseController working through the
// wrapper: go-sdk flushes every event with it.
func (w *noteWriter) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *noteWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
