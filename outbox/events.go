package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// Events: one log record per call (msg "call") and one per recorded delivery
// attempt (msg "delivery"). Keys name calls and principals name users, so
// both appear only as hash prefixes: enough to correlate records with each
// other and with a key the operator already holds, useless for replaying a
// call or learning who made it. Arguments and results never appear unless
// Options.LogSensitive (or dispatch.Options.LogSensitive) asks for them.

// hashPrefix is how logs and spans show a secret: see callkey.HashPrefix
// (48 bits), and callkey.KeyHash for a call's key.
func hashPrefix(s string) string { return callkey.HashPrefix(s) }

// principalLabel keeps the unauthenticated principal readable: it names no
// one, and "local" in a log says at once that auth was off.
func principalLabel(p string) string {
	if p == callkey.LocalPrincipal {
		return p
	}
	return hashPrefix(p)
}

func durationMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// logCall writes the call event of a, whose outcome is final.
func (l *Layer) logCall(ctx context.Context, a *attempt, req *mcp.CallToolRequest, d time.Duration) {
	l.traceCall(ctx, a) // the same moment, on the call's span
	if !l.logger.Enabled(ctx, slog.LevelInfo) {
		return // serve's --log-level warn or error: build nothing
	}
	attrs := []slog.Attr{
		slog.String("tool", a.tool.name),
		slog.String("outcome", a.outcome),
		slog.String("key_source", string(a.id.source)),
	}
	if a.id.key != "" {
		attrs = append(attrs, slog.String("key", callkey.KeyHash(a.id.principal, a.id.key)))
	}
	if a.toolCallID != "" {
		// This request's own id: a replay's is the retry's, while the
		// call's row keeps the one of the attempt that ran it.
		attrs = append(attrs, slog.String("tool_call_id", a.toolCallID))
	}
	ann := a.tool.annotations
	attrs = append(attrs,
		slog.String("principal", principalLabel(a.id.principal)),
		slog.Group("annotations",
			slog.Bool("read_only", ann.readOnly),
			slog.Bool("idempotent", ann.idempotent),
			slog.Bool("destructive", ann.destructive)),
		slog.Float64("duration_ms", durationMS(d)),
	)
	if reason, ok := a.cancel.get(); ok {
		// The client cancelled and the call ran on (CancelPolicy).
		attrs = append(attrs, slog.String("client_cancel", reason))
	}
	if l.opts.LogSensitive {
		attrs = append(attrs, slog.String("raw_key", a.id.key))
		if req != nil && req.Params != nil {
			attrs = append(attrs, slog.String("arguments", string(req.Params.Arguments)))
		}
	}
	l.logger.LogAttrs(ctx, slog.LevelInfo, "call", attrs...)
}

// toolAnnotations are a tool's hints as they apply, the spec's defaults
// filled in, so the event says what the layer assumed rather than what the
// tool happened to spell out.
type toolAnnotations struct {
	readOnly, idempotent, destructive bool
}

func annotationsOf(a *mcp.ToolAnnotations) toolAnnotations {
	if a == nil {
		// The spec's defaults: not read-only, not idempotent, destructive.
		return toolAnnotations{destructive: true}
	}
	ta := toolAnnotations{readOnly: a.ReadOnlyHint, idempotent: a.IdempotentHint, destructive: !a.ReadOnlyHint}
	if a.DestructiveHint != nil && !a.ReadOnlyHint {
		ta.destructive = *a.DestructiveHint
	}
	return ta
}
