package outbox

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// MetaKeyCall is the _meta entry of every recorded call's result: the key,
// where it came from, the outcome, and whether this result is a replay.
const MetaKeyCall = "io.github.mcp-outbox/call"

// MetaKeyError is the _meta entry of the layer's own errors: a stable code.
const MetaKeyError = "io.github.mcp-outbox/error"

// Codes under MetaKeyError.
const (
	codeInvalidKey       = "invalid_key"       // the key is unusable; nothing ran
	codeInvalidArguments = "invalid_arguments" // an argument would not reach the tool as sent (numbers.go); nothing ran
	codeConflict         = "key_conflict"      // the key named another call (HTTP 422 in the IETF draft)
	codeInProgress       = "in_progress"       // the original is still running (HTTP 409)
	codeNotRecorded      = "not_recorded"      // nothing committed; a retry runs the call
	codeUnknown          = "outcome_unknown"   // the call may have run; it never runs again by itself
)

// encodeResult stores a result in a protocol-neutral form: content,
// structured content and the error flag, without _meta or the fields a
// protocol version adds on the wire.
func encodeResult(cr *mcp.CallToolResult) (string, error) {
	b, err := json.Marshal(&mcp.CallToolResult{
		Content:           cr.Content,
		StructuredContent: cr.StructuredContent,
		IsError:           cr.IsError,
	})
	if err != nil {
		return "", fmt.Errorf("encode result: %w", err)
	}
	return string(b), nil
}

// replay rebuilds a recorded result, marked as a replay.
func replay(r callRow, id callIdentity) *mcp.CallToolResult {
	res, err := decodeRecorded(r)
	if err != nil {
		return unreadableResult(r, id, err)
	}
	when := time.UnixMilli(r.completedAt.Int64).UTC().Format(time.RFC3339Nano)
	var which string
	if id.source == callkey.SourceFingerprint {
		which = fmt.Sprintf("an identical call (same tool and arguments, no idempotency key) first made at %s",
			time.UnixMilli(r.createdAt).UTC().Format(time.RFC3339))
	} else {
		which = fmt.Sprintf("the call with idempotency key %q", id.key)
	}
	note := fmt.Sprintf("[mcp-outbox] Replayed: this is the recorded result of %s, which %s at %s. The tool did not run again.",
		which, r.state, when)
	if id.source == callkey.SourceFingerprint {
		note += " To make a separate new call, send a new idempotency key."
	}
	res.Content = append(res.Content, &mcp.TextContent{Text: note})
	setCallMeta(res, id, r.uid, r.state, true, r.createdAt, r.completedAt.Int64)
	return res
}

// decodeRecorded rebuilds the result stored with a call. Each call returns
// a new object: the SDK writes into a returned result's _meta.
func decodeRecorded(r callRow) (*mcp.CallToolResult, error) {
	var res mcp.CallToolResult
	if err := json.Unmarshal([]byte(r.result.String), &res); err != nil {
		return nil, err
	}
	return &res, nil
}

func unreadableResult(r callRow, id callIdentity, err error) *mcp.CallToolResult {
	return toolError(codeNotRecorded, "the recorded result of key %q cannot be read (%v); the call is recorded as %s.", id.key, err, r.state)
}

func setCallMeta(cr *mcp.CallToolResult, id callIdentity, uid, state string, replayed bool, created, completed int64) {
	if cr.Meta == nil {
		cr.Meta = mcp.Meta{}
	}
	cr.Meta[MetaKeyCall] = map[string]any{
		"key":         id.key,
		"keySource":   string(id.source),
		"callId":      uid,
		"state":       state,
		"replayed":    replayed,
		"createdAt":   time.UnixMilli(created).UTC().Format(time.RFC3339Nano),
		"completedAt": time.UnixMilli(completed).UTC().Format(time.RFC3339Nano),
	}
}

func toolError(code, format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}},
		Meta:    mcp.Meta{MetaKeyError: code},
	}
}

func conflictError(r callRow, a *attempt) *mcp.CallToolResult {
	what := "different arguments"
	if r.tool != a.tool.name {
		what = fmt.Sprintf("another tool (%s)", r.tool)
	}
	return toolError(codeConflict,
		"idempotency key %q was already used at %s for a call with %s; nothing was executed. Use a new key for a new call.",
		a.id.key, time.UnixMilli(r.createdAt).UTC().Format(time.RFC3339), what)
}

func inProgressError(a *attempt) *mcp.CallToolResult {
	return toolError(codeInProgress,
		"the call with idempotency key %q is still in progress in another attempt; nothing was executed. Ask the %s tool for its outcome, or retry later.",
		a.id.key, StatusToolName)
}

// writerBusyError answers a call whose claim found SQLite's write lock held
// by another process for the whole in-flight wait.
func writerBusyError(a *attempt, waited time.Duration) *mcp.CallToolResult {
	return toolError(codeInProgress,
		"another process holds the database's write lock and did not release it within %s; the call with idempotency key %q "+
			"was not recorded and nothing was executed. Retry later: the retry runs it, or replays its outcome if another "+
			"attempt has completed it meanwhile (the %s tool tells).",
		waited, a.id.key, StatusToolName)
}

func unknownError(r callRow, a *attempt) *mcp.CallToolResult {
	return toolError(codeUnknown,
		"the outcome of the call with idempotency key %q is unknown: it was handed to the tool server at %s and its answer was lost. "+
			"It may or may not have run, so it is not run again. Ask the %s tool for its state; an operator settles it "+
			"(mcp-outbox outbox resolve-call). Use a new key only for a deliberately new call.",
		a.id.key, time.UnixMilli(r.createdAt).UTC().Format(time.RFC3339), StatusToolName)
}
