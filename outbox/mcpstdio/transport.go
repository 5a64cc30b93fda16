package mcpstdio

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/cancelnote"
	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
	"github.com/mcp-outbox/mcp-outbox/internal/tasknote"
)

// Options configure [NewTransport]. A nil *Options, like the zero value,
// means the defaults.
type Options struct {
	// Logger receives a warning for every line of stdio that is answered
	// with an error instead of reaching the SDK. Nil discards them. Like
	// every log of an MCP server on stdio, it must not write to stdout.
	Logger *slog.Logger
}

// NewTransport returns t for a server of the outbox layer. Its connection
// lifts a top-level params.idempotencyKey of tools/call requests (SEP-3182)
// into a _meta member of the layer's own, where the layer finds it: the
// go-sdk would drop it. It lifts params.task (a 2025-11-25 client asking
// for a task) the same way. Use it around stdio, command and in-memory
// transports; Streamable HTTP gets the same from mcphttp.
//
// Around an *mcp.StdioTransport or an *mcp.IOTransport it also reads the
// lines itself, on the same streams and with the same MaxLineLength: a line
// that is not a JSON-RPC message (not JSON, too long, too deeply nested, a
// bad batch) gets a JSON-RPC error response, under the request's id when it
// has a usable one, and the session goes on. The go-sdk alone would end the
// session there, with every call in flight.
//
// opts may be nil.
func NewTransport(t mcp.Transport, opts *Options) mcp.Transport {
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
	return &liftConn{Connection: c, tracker: cancelnote.NewTracker()}, nil
}

// SupportsProtocolVersion forwards the optional interface of the wrapped
// transport, which Server.Connect consults for server/discover.
func (t *liftTransport) SupportsProtocolVersion(v string) bool {
	if s, ok := t.supporter.(mcp.ProtocolVersionSupporter); ok {
		return s.SupportsProtocolVersion(v)
	}
	return true
}

type liftConn struct {
	mcp.Connection
	// tracker tells the layer why a client cancelled a call, and this
	// connection which responses not to write (see cancelnote).
	tracker *cancelnote.Tracker
}

func (c *liftConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		return msg, err
	}
	if req, ok := msg.(*jsonrpc.Request); ok {
		switch req.Method {
		case "tools/call":
			if p, changed := paramskey.LiftCall(req.Params); changed {
				req.Params = p
			}
		case "initialize":
			if p, changed := paramskey.MarkFront(req.Params); changed {
				req.Params = p
			}
		case "subscriptions/listen":
			if id, err := json.Marshal(req.ID.Raw()); err == nil && req.ID.IsValid() {
				if p, changed := paramskey.LiftListen(id, req.Params); changed {
					req.Params = p
				}
			}
		}
	}
	return c.tracker.Read(msg), nil
}

// Write sends msg, except the response to a request the client cancelled:
// the spec says a receiver should not answer one, and Claude Code 2.1.332,
// given such an answer over stdio, logs "Received a response for an
// unknown message ID". A notification the layer could not send through
// go-sdk (a task's status, see tasknote) is written as itself.
func (c *liftConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if c.tracker.Answer(msg) {
		return nil
	}
	return c.Connection.Write(ctx, tasknote.Rewrite(msg))
}

func (c *liftConn) Close() error {
	c.tracker.Close()
	return c.Connection.Close()
}
