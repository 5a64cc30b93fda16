// Package dispatch delivers the effects that tool calls of package outbox
// committed: each to its destination, an HTTP API, with the same
// Idempotency-Key on every attempt, retried on a backoff schedule until it
// is delivered, dead or (for an AtMostOnce destination) unknown.
//
// In a server, outbox.Layer.Start runs a [Dispatcher] for the server's
// lifetime: give it the destinations in outbox.StartOptions.Dispatcher.
// A process that only delivers (mcp-outbox drain) makes one with [New] and
// calls [Dispatcher.Drain]; a program that runs its own loop calls
// [Dispatcher.Run] and connects the layer's commits with
// Layer.OnEnqueue(d.Notify).
//
// # The request
//
// An attempt sends the effect's method, path (on the destination's URL),
// headers and body. The dispatcher adds these headers, over the effect's
// own except for Content-Type:
//
//	Idempotency-Key  the key Enqueue returned, as a Structured Field String
//	                 ("call_…-1", draft-ietf-httpapi-idempotency-key-header),
//	                 or bare (call_…-1, Stripe's form) for a destination
//	                 whose KeyForm is KeyBare
//	Content-Type     application/json when the body is JSON (json.Valid)
//	                 and the effect set no Content-Type, in any case of the
//	                 name: the effect's own wins. Another body without one
//	                 is sent without one; the dispatcher does not guess.
//	traceparent      the attempt's span (see Traces)
//	AuthHeader       the destination's credential, when it has one
//
// # Traces
//
// Each delivery attempt is a CLIENT span (Options.TracerProvider, nil
// meaning the global one), a child of the span of the call that enqueued
// the effect, and its traceparent goes to the destination. Beside the HTTP
// client conventions' attributes it carries:
//
//	mcp_outbox.destination                  the destination's configured name
//	mcp_outbox.effect.id                    the effect's row id
//	mcp_outbox.effect.seq                   its position in its call, from 1
//	mcp_outbox.delivery.result              delivered, retry, dead or unknown
//	mcp_outbox.effect.idempotency_key_hash  the effect's Idempotency-Key as
//	                                        a 12-digit hash
//
// The spans share package outbox's instrumentation scope.
package dispatch
