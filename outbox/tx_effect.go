package outbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
)

// Effect is a request to a downstream HTTP API, delivered after the call
// commits by the dispatcher.
type Effect struct {
	// Destination names a configured destination (its base URL is not
	// stored, so it can change without touching queued effects).
	Destination string
	// Method is the HTTP method; empty means POST.
	Method string
	// Path is appended to the destination's base URL; it must start with '/'.
	Path string
	// Header holds extra request headers. Secrets do not belong here: they
	// are stored in the database. Configure them on the destination.
	Header map[string]string
	// Body is the request body.
	Body []byte
}

// Enqueue adds an effect to the call's transaction. Every error it returns
// is the Tx's, never shown to the client (see showable): it speaks of the
// server's configuration or state, which the model cannot act on.
func (a *attempt) Enqueue(ctx context.Context, e Effect) (key string, err error) {
	defer func() { a.noteReturned(err) }()
	if a.tool.readOnly {
		// Like a write: an effect that would never be sent must not be
		// reported as done, whatever the handler answers.
		err = fmt.Errorf("outbox: enqueue in tool %q, which is annotated readOnlyHint: its transaction is never "+
			"committed, so the effect would never be sent; a tool that enqueues must not be annotated readOnlyHint: %w",
			a.tool.name, ErrReadOnly)
		if a.txErr == nil {
			a.txErr = &txError{err}
		}
		return "", err
	}
	if err := a.layer.checkEffect(&e); err != nil {
		return "", err
	}
	headers, err := effectHeaders(e)
	if err != nil {
		return "", err
	}
	if a.txErr != nil {
		return "", a.txErr
	}
	if a.failedStmt != nil {
		// PostgreSQL aborted the transaction at that statement's error; a
		// deferred effect would be written by the outcome's statement,
		// which cannot run either. Say so here, where the handler can
		// still notice, rather than answer a key for an effect that will
		// never exist.
		return "", fmt.Errorf("outbox: enqueue effect: an earlier statement's error aborted the call's transaction, "+
			"so nothing more of the call can commit: %w", a.failedStmt)
	}
	if err := a.begin(ctx); err != nil {
		return "", err
	}
	a.effects++
	key = callkey.EffectKey(a.uid, a.effects)
	now := a.layer.nowMS()
	// Sealed here, on both stores: a deferred effect (PostgreSQL) is
	// written by the outcome's statement as it stands now.
	headers, body, err := sealEffect(func(ref sealing.Ref, v []byte) ([]byte, error) { return a.seal(a.tx, ref, v) },
		key, a.id.principal, headers, e.Body)
	if err != nil {
		a.effects--
		return "", err
	}
	if a.defersEffects() {
		a.pending = append(a.pending, pendingEffect{seq: a.effects, destination: e.Destination, method: e.Method, path: e.Path,
			headers: headers, body: body, key: key, at: now, traceparent: traceparentOf(ctx)})
		return key, nil
	}
	var callID any
	if a.recorded() {
		callID = a.callID
	}
	_, err = a.unit.exec(insertEffect,
		callID, a.id.principal, a.effects, e.Destination, e.Method, e.Path, headers, body, key, now, now, now, traceparentOf(ctx))
	if err != nil {
		a.effects--
		return "", a.wrap(fmt.Errorf("enqueue effect: %w", err))
	}
	return key, nil
}

const insertEffect = `
INSERT INTO effects (call_id, principal, seq, destination, method, path, headers, body, idempotency_key,
                     next_attempt_at, created_at, updated_at, traceparent)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`

func validateEffect(e *Effect) error {
	if e.Destination == "" {
		return errors.New("outbox: effect without destination")
	}
	if e.Method == "" {
		e.Method = http.MethodPost
	}
	e.Method = strings.ToUpper(e.Method)
	if !isToken(e.Method) {
		return fmt.Errorf("outbox: effect method %q is not an HTTP token", e.Method)
	}
	if !strings.HasPrefix(e.Path, "/") {
		return fmt.Errorf("outbox: effect path %q must start with /", e.Path)
	}
	for k, v := range e.Header {
		if !isToken(k) || strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("outbox: effect header %q is not valid", k)
		}
		if strings.EqualFold(k, HeaderIdempotencyKey) {
			return errors.New("outbox: effect headers must not set Idempotency-Key; the dispatcher sets it")
		}
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2), the
// syntax of both methods and header names.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
