package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// SEP-3182 proposed a top-level params.idempotencyKey on tools/call. The
// go-sdk unmarshals params into CallToolParamsRaw, which has no such field,
// so the key is gone before any middleware runs. It has to be caught below
// the SDK, in the raw JSON-RPC message: WrapTransport does that for stdio
// and other message transports, LiftParamsKey for Streamable HTTP bodies.
// Both copy the key into params._meta under MetaKeyParamsKey, where the
// layer looks for it after _meta.idempotencyKey.

// WrapTransport returns a transport whose connection lifts a top-level
// params.idempotencyKey of tools/call requests into _meta. Use it around
// stdio, command and in-memory transports; for Streamable HTTP use
// LiftParamsKey.
//
// Around an *mcp.StdioTransport or an *mcp.IOTransport it also reads the
// lines itself, on the same streams and with the same MaxLineLength: a line
// that is not a JSON-RPC message (not JSON, too long, too deeply nested, a
// bad batch) gets a JSON-RPC error response, under the request's id when it
// has a usable one, and the session goes on. The go-sdk alone would end the
// session there, with every call in flight. WrapTransport is
// WrapTransportWithOptions with nil options: rejected lines are not logged.
func WrapTransport(t mcp.Transport) mcp.Transport { return WrapTransportWithOptions(t, nil) }

// TransportOptions configures WrapTransportWithOptions. The zero value is
// usable.
type TransportOptions struct {
	// Logger receives a warning for every line of stdio that is answered
	// with an error instead of reaching the SDK. Nil discards them. Like
	// every log of an MCP server on stdio, it must not write to stdout.
	Logger *slog.Logger
}

// WrapTransportWithOptions is WrapTransport with options; opts may be nil.
func WrapTransportWithOptions(t mcp.Transport, opts *TransportOptions) mcp.Transport {
	var logger *slog.Logger
	if opts != nil {
		logger = opts.Logger
	}
	if lt := newLineTransport(t, logger); lt != nil {
		return &liftTransport{Transport: lt, supporter: t}
	}
	return &liftTransport{Transport: t, supporter: t}
}

type liftTransport struct {
	mcp.Transport
	// supporter is the transport the caller gave, whose optional
	// interfaces liftTransport forwards (Transport may stand in for it).
	supporter mcp.Transport
}

func (t *liftTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &liftConn{c}, nil
}

// SupportsProtocolVersion forwards the optional interface of the wrapped
// transport, which Server.Connect consults for server/discover.
func (t *liftTransport) SupportsProtocolVersion(v string) bool {
	if s, ok := t.supporter.(mcp.ProtocolVersionSupporter); ok {
		return s.SupportsProtocolVersion(v)
	}
	return true
}

type liftConn struct{ mcp.Connection }

func (c *liftConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if req, ok := msg.(*jsonrpc.Request); ok && err == nil && req.Method == "tools/call" {
		if p, changed := liftParams(req.Params); changed {
			req.Params = p
		}
	}
	return msg, err
}

// LiftParamsKey is HTTP middleware for the Streamable HTTP endpoint: it
// lifts a top-level params.idempotencyKey of tools/call requests in a POST
// body (a single message or a batch) into _meta. Bodies it cannot parse pass
// through unchanged, for the SDK to reject.
func LiftParamsKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		// Read at most the SDK's own limit: a larger body is refused by
		// the SDK anyway, and must not be buffered whole here first.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, mcp.DefaultMaxRequestBodyBytes))
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
		if out, changed := liftBody(body); changed {
			body = out
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

func liftBody(body []byte) ([]byte, bool) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return body, false
	}
	if trimmed[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(trimmed, &batch) != nil {
			return body, false
		}
		changed := false
		for i, m := range batch {
			if out, ok := liftMessage(m); ok {
				batch[i], changed = out, true
			}
		}
		if !changed {
			return body, false
		}
		out, err := json.Marshal(batch)
		return out, err == nil
	}
	return liftMessage(trimmed)
}

func liftMessage(m json.RawMessage) (json.RawMessage, bool) {
	var msg map[string]json.RawMessage
	if json.Unmarshal(m, &msg) != nil {
		return m, false
	}
	var method string
	if json.Unmarshal(msg["method"], &method) != nil || method != "tools/call" {
		return m, false
	}
	p, changed := liftParams(msg["params"])
	if !changed {
		return m, false
	}
	msg["params"] = p
	out, err := json.Marshal(msg)
	if err != nil {
		return m, false
	}
	return out, true
}

// liftParams copies params.idempotencyKey into params._meta. The value is
// copied as it is, even when it is not a string, so that the layer reports
// a bad key instead of silently ignoring it.
func liftParams(params json.RawMessage) (json.RawMessage, bool) {
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil {
		return params, false
	}
	key, ok := p["idempotencyKey"]
	if !ok {
		return params, false
	}
	meta := map[string]json.RawMessage{}
	if raw, ok := p["_meta"]; ok && json.Unmarshal(raw, &meta) != nil {
		return params, false
	}
	if meta == nil {
		// "_meta": null unmarshals to a nil map, and assigning to it would
		// panic in the SDK's reader: the whole server would go down.
		meta = map[string]json.RawMessage{}
	}
	meta[MetaKeyParamsKey] = key
	mb, err := json.Marshal(meta)
	if err != nil {
		return params, false
	}
	p["_meta"] = mb
	out, err := json.Marshal(p)
	if err != nil {
		return params, false
	}
	return out, true
}
