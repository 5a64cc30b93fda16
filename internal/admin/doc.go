// Package admin holds an operator's writes to an outbox database: settling
// effects and calls whose outcome is in doubt, retrying or cancelling
// effects, and purging expired records on demand. The mcp-outbox command's
// outbox and purge subcommands and the operator surface's admin API are
// built on it; it is internal so that those two are the one way in.
//
// Every action is one statement whose WHERE clause names the states it
// applies to, so it cannot race a dispatcher or a call in flight: an
// effect under a dispatcher's lease, or a call that is not unknown, is
// never changed, and the action says what state it found instead
// ([ErrEffectState], [ErrCallNotUnknown]). Nothing here needs a running
// layer or dispatcher; the database ([schema.DB]) is enough, on SQLite and
// on PostgreSQL alike.
//
// The continuous purge, the reaper outbox.Layer.Start runs, stays beside
// the layer: [Purge] is the same deletion, run once.
package admin
