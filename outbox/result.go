package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/replaynote"
)

// MetaKeyCall is the _meta entry of every recorded call's result: the key,
// where it came from, the outcome, and whether this result is a replay
// ("replayed"), and of a replay whether it joined the attempt that was
// still running its call ("joined").
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
	// The call is recorded but its result cannot be shown. Not
	// not_recorded, whose promise ("a retry runs the call") would be false
	// here: a client that retries on it would loop on an answer that never
	// changes, since the row exists and the call never runs again.
	codeErased     = "erased"     // the principal was forgotten (mcp-outbox encryption forget-principal)
	codeUnreadable = "unreadable" // changed, copied from another row, or under a key the key file lacks
)

// errEncodeResult: the result cannot be stored as JSON (a value JSON
// cannot hold, such as NaN, in its structured content). A run of the
// call again would fail the same way: it is the handler's fault, not the
// store's (giveTaskBack).
var errEncodeResult = errors.New("encode result")

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
		return "", fmt.Errorf("%w: %w", errEncodeResult, err)
	}
	return string(b), nil
}

// replay rebuilds a recorded result for a, a retry that found it (a
// replay) or waited for it (a join; a.outcome says which), marked so: the
// note goes in a last content block and, where the tool's output schema
// allows it, in the structured content under ReplayNoteProperty, since
// some clients show the model only that (replaynote.go).
func replay(r callRow, a *attempt) *mcp.CallToolResult {
	res, err := decodeRecorded(r)
	if err != nil {
		return unreadableResult(r, a.id, err)
	}
	note := replayNote(r, a)
	res.Content = append(res.Content, &mcp.TextContent{Text: note})
	if a.tool.structuredNote {
		res.StructuredContent, _ = replaynote.Add(res.StructuredContent, note)
	}
	setCallMeta(res, a.id, r.uid, r.state, true, r.createdAt, r.completedAt.Int64)
	// A join is a replay too; this says which, without parsing the note.
	res.Meta[MetaKeyCall].(map[string]any)["joined"] = a.outcome == outcomeJoined
	return res
}

// decodeRecorded rebuilds the result stored with a call. Each call returns
// a new object: the SDK writes into a returned result's _meta.
func decodeRecorded(r callRow) (*mcp.CallToolResult, error) {
	if r.unreadable != nil {
		return nil, r.unreadable
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal([]byte(r.result.String), &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// unreadableCode is the code of the answer about a recorded result that err
// keeps from being read.
func unreadableCode(err error) string {
	if errors.Is(err, sealing.ErrErased) {
		return codeErased
	}
	return codeUnreadable
}

func unreadableResult(r callRow, id callIdentity, err error) *mcp.CallToolResult {
	return toolError(unreadableCode(err), "the recorded result of %s cannot be read (%v); the call is recorded as %s.", earlierCall(id), err, r.state)
}

// The layer's answers name the call they are about. A call that came
// without a key is known by a fingerprint of its tool and arguments, which
// the client never saw: calling it a key, or telling the client to use a
// new one, would only confuse. These say what holds for each kind.

// keyless reports whether the call came without a key.
func keyless(id callIdentity) bool { return id.source == callkey.SourceFingerprint }

// thisCall names the call being answered.
func thisCall(id callIdentity) string {
	if keyless(id) {
		return "this call (sent without an idempotency key)"
	}
	return fmt.Sprintf("the call with idempotency key %q", id.key)
}

// earlierCall names the call whose record or attempt the answer is about:
// for a key, the call with that key; without one, an identical call.
func earlierCall(id callIdentity) string {
	if keyless(id) {
		return "an identical call (same tool and arguments, sent without an idempotency key)"
	}
	return fmt.Sprintf("the call with idempotency key %q", id.key)
}

// askStatus tells how to ask the status tool about the call.
func askStatus(id callIdentity) string {
	if keyless(id) {
		return fmt.Sprintf("Ask the %s tool, giving this tool's name and the same arguments,", StatusToolName)
	}
	return fmt.Sprintf("Ask the %s tool with key %q", StatusToolName, id.key)
}

func setCallMeta(cr *mcp.CallToolResult, id callIdentity, uid, state string, replayed bool, created, completed int64) {
	if cr.Meta == nil {
		cr.Meta = mcp.Meta{}
	}
	cr.Meta[MetaKeyCall] = callMeta(id, uid, state, replayed, created, completed)
}

func callMeta(id callIdentity, uid, state string, replayed bool, created, completed int64) map[string]any {
	return map[string]any{
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
	if keyless(a.id) {
		// A fingerprint is the hash of the principal, the tool and the
		// arguments, so only a hash collision gets here.
		return toolError(codeConflict,
			"a call with %s made at %s has the same fingerprint as this call (sent without an idempotency key); nothing was executed. "+
				"Send an idempotency key to tell the two apart.",
			what, time.UnixMilli(r.createdAt).UTC().Format(time.RFC3339))
	}
	return toolError(codeConflict,
		"idempotency key %q was already used at %s for a call with %s; nothing was executed. Use a new key for a new call.",
		a.id.key, time.UnixMilli(r.createdAt).UTC().Format(time.RFC3339), what)
}

func inProgressError(a *attempt) *mcp.CallToolResult {
	return toolError(codeInProgress,
		"%s is still in progress in another attempt; nothing was executed. %s for its outcome, or retry later.",
		earlierCall(a.id), askStatus(a.id))
}

// writerBusyError answers a call whose claim found SQLite's write lock held
// by another process for the whole in-flight wait.
func writerBusyError(a *attempt, waited time.Duration) *mcp.CallToolResult {
	return toolError(codeInProgress,
		"another process holds the database's write lock and did not release it within %s; %s "+
			"was not recorded and nothing was executed. Retry later: the retry runs it, or replays its outcome if another "+
			"attempt has completed it meanwhile (the %s tool tells).",
		waited, thisCall(a.id), StatusToolName)
}

func unknownError(r callRow, a *attempt) *mcp.CallToolResult {
	next := "Use a new key only for a deliberately new call."
	if keyless(a.id) {
		// claimOnce sets the call aside once the window has passed.
		next = fmt.Sprintf("Identical calls without an idempotency key get this answer until %s, the end of the "+
			"fingerprint window; after that, an identical call runs as a new call. A call that carries a key is told apart by its key.",
			time.UnixMilli(r.expiresAt).UTC().Format(time.RFC3339))
	}
	return toolError(codeUnknown,
		"the outcome of %s is unknown: it was handed to the tool server at %s and its answer was lost. "+
			"It may or may not have run, so it is not run again. %s for its state; an operator settles it "+
			"(mcp-outbox outbox resolve-call). %s",
		earlierCall(a.id), time.UnixMilli(r.createdAt).UTC().Format(time.RFC3339), askStatus(a.id), next)
}
