// Package outbox makes side-effecting MCP tool calls happen once per logical
// call on a github.com/modelcontextprotocol/go-sdk server whose state lives in
// SQLite, or in PostgreSQL when several replicas share it (see "On
// PostgreSQL" below).
//
// # The invariant
//
// A recorded call's own writes, the outbox effects it enqueues and its
// outcome commit in one SQLite transaction, or not at all. So:
//
//   - a retry of a committed call replays the recorded result and runs nothing;
//   - a retry of a call that never committed runs it, because nothing of it exists;
//   - effects exist only for committed calls, and the dispatcher delivers them.
//
// # What commits when
//
// A call goes through two steps on the single writer connection (see
// package schema), each a unit of group commit (below):
//
//  1. The claim finds the call's row by (principal, key). No row, or an
//     expired one: it inserts the row in state in_flight with this attempt
//     as owner and a lease. A completed or failed row with the same tool and
//     arguments: the result is replayed. Other arguments: a conflict. An
//     in_flight row whose owner is alive: the attempt waits. An in_flight
//     row whose owner is dead or whose lease has passed: the attempt takes
//     the row over by writing itself as owner. The claim does not wait for a
//     commit of its own: it commits with whatever batch it rode in, at the
//     latest with the call's outcome, and the outcome's full commit makes it
//     durable. A claim lost to a crash only forgets a call that had
//     committed nothing. Waiting is bounded by [Options.InFlightWait]: a
//     duplicate whose original is still running then gets an in_progress
//     error. So does a claim that finds SQLite's write lock held by
//     another process (SQLITE_BUSY past the busy timeout, for instance
//     while a handler there holds the writer): it tries again, with
//     backoff, until the in-flight wait ends, and its error says that
//     another process holds the database, that nothing was executed and
//     that a retry later runs the call or replays its outcome.
//  2. The outcome: the handler's unit, begun at the handler's first
//     statement. It first checks that the row still names this attempt as
//     owner (the fence), runs the handler's statements and effects, then
//     writes the state and the result. A failed outcome (see "What is
//     recorded") rolls the handler's work back and records state failed;
//     the error is replayed like a result. The call answers only once the
//     commit holding its outcome is durable.
//
// # What is recorded
//
// What a handler returns decides, so that a retry repeats only what a
// retry would repeat anyway:
//
//   - A result, isError or not, is the call's outcome. So is an error the
//     handler marks with [Final]: a business rejection such as "card
//     declined", whose text the client reads. A failed outcome keeps
//     nothing of the handler's work (its rows and effects roll back); it is
//     recorded as failed and replayed to a retry with the same key.
//   - Any other error is a fault, not an outcome: a bad statement, a bug, a
//     downstream that did not answer. The handler's work rolls back and the
//     claim is released, so nothing of the call is recorded and a retry runs
//     the handler again. The client gets a generic tool error (code
//     not_recorded) naming the call id, never the error's text, which may be
//     a driver's; the layer logs the error at level ERROR with that call_id.
//     With [Options.ShowErrors] or [ToolOptions.ShowErrors], the client gets
//     the error's text instead (still not_recorded, and a retry runs the
//     handler again): a validation error such as
//     fmt.Errorf("unsupported currency %q", c) tells the model what to
//     change. The database's text is never passed on: an error that wraps
//     one the Tx returned, one of a driver's or database/sql's, or any error
//     after the call's transaction failed, still gets the generic answer.
//   - A failure of the database under the handler (busy, I/O, full, the
//     connection gone) is never recorded either, even if the handler marks
//     it Final: it says nothing of the call.
//   - A *jsonrpc.Error is a protocol error: answered as it is, not recorded.
//
// # The handler's transaction
//
// A handler gets a [Tx]: ExecContext, QueryContext, QueryRowContext and
// PrepareContext, the methods of sqlc's DBTX interface for database/sql,
// plus Enqueue. Code sqlc generates takes it as is (New(tx)), so generated
// queries run in the call's transaction; examples/sqlc has sqlc's output
// for both engines and a test that runs it in handlers. The context
// passed to these methods does not reach the driver (the layer decides at
// the end whether a cancelled call commits; on SQLite an interrupted
// statement would roll back the transaction other calls share), except
// for statements PrepareContext returns, which run with the context their
// caller passes.
//
// The layer begins and commits that transaction, so Tx refuses, before
// anything runs, every statement that would take this from it or change
// the connection under it: transaction control (BEGIN, START, COMMIT, END,
// ROLLBACK, ABORT, SAVEPOINT, RELEASE, PREPARE TRANSACTION and COMMIT or
// ROLLBACK PREPARED), ATTACH, DETACH, VACUUM, the session's state (SET,
// RESET, DISCARD, LISTEN, UNLISTEN, PREPARE, DEALLOCATE, LOAD, set_config,
// pg_settings: SET LOCAL synchronous_commit = off would make the call's
// commit not durable) and every SQLite PRAGMA except the read-only ones
// that describe the schema (table_info, index_list, foreign_key_list and
// their kind). A COMMIT would commit the call's rows without its outcome,
// so a retry would run it again, and on SQLite would commit other calls'
// half-done work too. Texts of several statements are checked statement
// by statement, with comments, string literals, quoted identifiers,
// dollar-quoted bodies and SQLite trigger bodies read as the database
// reads them. The error wraps [ErrStatementRefused] and names the
// statement. A refused statement, like a failure of the database under
// the handler, leaves the call unable to commit: nothing more runs in it,
// nothing of it is recorded whatever the handler returns, the client is
// told so, and a retry runs the call again. So does a statement error
// after which SQLite ended the shared transaction itself (ON CONFLICT
// ROLLBACK, RAISE(ROLLBACK)): a later statement would otherwise run in
// autocommit mode and commit at once. Behind the guard, SQLite's writer
// connection refuses any commit while a handler holds it (a commit hook),
// which covers statements PrepareContext returned too. (PostgreSQL's
// SQL-standard function bodies, BEGIN ATOMIC … END, are refused too: use
// a $$ body.)
//
// Some transactions are never committed, and a write in them would vanish
// while the handler reported it done. A tool annotated readOnlyHint runs
// in a read-only transaction (BEGIN READ ONLY on PostgreSQL; on SQLite
// with PRAGMA query_only on its connection, since the driver's
// TxOptions.ReadOnly does not make SQLite refuse writes): a write fails
// at its statement with an error wrapping [ErrReadOnly], and the call
// answers not_recorded whatever the handler returns. Every other tool's
// transaction commits when the handler succeeds, a tool whose calls are
// not recorded (idempotentHint) included. Its work is rolled back only by
// the handler's own answer, which comes after its statements: an error, a
// result with isError (a failed outcome keeps nothing), a multi
// round-trip request for input (only the run that completes the call
// keeps its work), or a cancel that stops the call.
//
// On PostgreSQL an error aborts the transaction: every later statement
// fails with SQLSTATE 25P02, which does not say why, and nothing of the
// call can commit. The layer remembers the first failed statement: the
// error of each later statement names it and its error, and a handler
// that answers success anyway gets not_recorded, with the first error in
// the log under the call id. (On SQLite a failed statement leaves the
// transaction usable, unless SQLite ended it, above.)
//
// Work that must commit outside any call, from an HTTP handler or a job,
// can enqueue an effect in its own transaction with [Layer.EnqueueTx]: the
// effect commits or rolls back with that transaction.
//
// # Group commit
//
// SQLite has one writer and a durable commit costs an fsync, so the writer's
// transactions are shared: units take turns in one open transaction, each
// inside its own SAVEPOINT, so a unit that fails rolls back only its own
// work. A unit that ends while others wait for their turn leaves the
// transaction open for them; the last one, or the one that reaches
// [Options.MaxBatchCalls] or [Options.MaxBatchWait], commits it. A lone call
// never waits for company. If a batch cannot commit (an I/O error, or a
// statement whose ON CONFLICT ROLLBACK ended the whole transaction), none of
// its calls is recorded and each is told so; a retry runs them.
//
// # States of a call row
//
//	in_flight  claimed by the attempt named in owner; nothing of the handler's
//	           work is visible. If that attempt dies, the row is taken over.
//	completed  the handler's writes, its effects and the result are committed.
//	failed     the handler returned an isError result or a [Final] error;
//	           its writes were rolled back, the error is recorded and
//	           replayed. A task that ended without an outcome (cancelled
//	           before its commit, or a fault) is failed too, with
//	           calls.task_end saying which (see Tasks); a cancelled one
//	           is set aside under a key of its own, as below.
//	unknown    a call the proxy (outbox/sidecar) forwarded whose answer was
//	           lost: it may or may not have run, so it never runs again by
//	           itself; a retry gets an outcome_unknown error until an
//	           operator settles it (outbox resolve-call). It never expires;
//	           but a call made without a key blocks identical calls only
//	           for its fingerprint window, after which it is set aside
//	           under a key of its own (fingerprint/uid) and an identical
//	           call runs as a new call.
//
// A claim records what its abandonment means (calls.on_lost): 'rerun' for
// the layer's own tools, whose work commits with the outcome, so a claim
// without an outcome committed nothing; 'unknown' for calls forwarded to a
// process that does not record its outcome in the call's transaction, which
// is why such a claim commits with an fsync before the call is forwarded.
//
// An attempt that ends without an outcome (the client cancelled before the
// commit, the handler was never reached because the arguments failed the
// schema, a database error, a handler error not marked [Final]) deletes its
// in_flight row: the call leaves no trace and a retry runs it.
//
// # Tasks
//
// A tool registered with [ToolOptions.Tasks] may answer a tools/call with
// a task (MCP 2026-07-28's extension [ExtensionTasks], and the
// experimental Tasks of 2025-11-25) whose row is its call's: committed
// durably before the task is answered, run detached from the request,
// found again by a retry of the same logical call, and run again by the
// task runner of [Layer.Start] when its process dies. What each method
// answers in each generation, what ends a task and what it survives:
// docs/tasks.md in the repository.
//
// # Cancellation
//
// A client's notifications/cancelled that arrives while the handler runs
// stops the call (its work rolls back, nothing is recorded) or not, as the
// tool's [CancelPolicy] says; by default ([FinishOnTimeout]) a cancel whose
// reason says the client timed out does not stop it, because a timeout is no
// decision about the call: the call commits, and the client's retry joins it
// or replays its outcome. The reasons clients send on a timeout, and that
// the layer takes for one (any reason containing "timed out", "timeout" or
// "deadline exceeded"):
//
//	Claude Code 2.1.332 (TypeScript SDK 2.x)  SdkError: Request timed out
//	TypeScript SDK 1.x                        McpError: MCP error -32001: Request timed out
//	Python SDK 2.3.0                          Request timed out
//	go-sdk client (a context deadline)        context deadline exceeded
//
// The Python SDK 1.x sends no cancel on a timeout. Over stateless HTTP
// (2026-07-28) no cancel reaches a call, whatever the policy: the request
// belongs to no session, so a cancel in a POST of its own (the go-sdk client
// sends one) names an id the server cannot tie to it, and an aborted POST
// does not end the call either; Claude Code only drops the connection. A cancelled request gets no answer over stdio
// (mcpstdio) or through the proxy, as the spec asks; over a Streamable HTTP
// session the go-sdk still writes it on the request's stream.
//
// The go-sdk drops a cancel's reason before any middleware runs, so the
// layer learns it from the transport: mcpstdio.NewTransport,
// mcphttp.NewHandler and the proxy tell it. Through any other transport the
// layer cannot tell a timeout from a user's cancel, and every cancel stops
// the call.
//
// # Effects and their delivery
//
// An effect row exists only for a committed call. A [dispatch.Dispatcher] delivers
// it: it leases due effects (owner-fenced: an expired owner cannot record an
// outcome), sends each with the same Idempotency-Key on every attempt, and
// records the outcome. Effect states:
//
//	pending    due at next_attempt_at (first attempt or a retry)
//	in_flight  leased by a dispatcher; reclaimed when the lease passes or the
//	           dispatcher's process is gone
//	delivered  the destination answered 2xx
//	dead       refused (4xx) or past the attempt or age limit
//	unknown    an at_most_once destination may or may not have applied it;
//	           never re-sent automatically; a probe or an operator decides
//	cancelled  stopped by an operator
//
// # Lifecycle
//
// A server needs three things beside the layer: a dispatcher that delivers
// the effects, woken by every commit that enqueued some; a reaper that
// purges finished records, without which the tables grow without bound;
// and an order in which they stop. [Layer.Start] begins the first two and
// [Runner.Stop] ends them:
//
//	db, err := schema.Open(ctx, target, nil)  // an SQLite file or a postgres:// URL
//	...
//	defer db.Close()                           // deferred first, so it closes last
//	layer, err := outbox.New(db, nil)
//	server := layer.NewServer(impl, nil)
//	outbox.AddTool(layer, server, tool, sendInvoice, nil) // the tool's handler (see AddTool)
//	running, err := layer.Start(ctx, &outbox.StartOptions{Dispatcher: &dispatch.Options{
//		Destinations: []dispatch.Destination{{Name: "mailer", URL: mailerURL}},
//	}})
//	...
//	hopts := &mcphttp.Options{}                 // the same to both: each reads its own bounds
//	h := mcphttp.NewHandler(server, hopts)      // keeps every key source (see below)
//	err = mcphttp.ServeWith(ctx, ln, h, hopts)  // returns once the calls in flight finished (bounded)
//	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute) // then tasks stop
//	defer cancel()
//	return errors.Join(err, running.Stop(sctx))
//
// Serve HTTP with mcphttp.NewHandler (or wrap your own endpoint in
// mcphttp.LiftParamsKey) and stdio with mcpstdio.NewTransport: go-sdk's
// own mcp.NewStreamableHTTPHandler drops a top-level
// params.idempotencyKey while it unmarshals the request, so such a call
// falls back to a fingerprint without a word.
//
// The order matters: serving stops first, and the calls in flight finish
// (mcphttp.Serve shuts its server down gracefully when ctx ends, waiting
// up to mcphttp.DefaultShutdownTimeout, a minute, and then hands over
// what still runs: each such call either commits before the process
// exits or leaves nothing, and a retry replays or runs it; go-sdk's
// Server.Run, when its context ends, closes the session, which waits for
// the requests in flight); then Stop lets the deliveries
// in flight finish, bounded by its context and
// [dispatch.Options.ShutdownTimeout], and cancels the rest, which are
// sent again with the same Idempotency-Key at the next Start; the database
// closes last. Cancelling Start's context does not stop the work: only
// Stop does. An effect that a call commits after Stop is not lost: it is
// delivered at the next Start.
//
// The reaper purges at once and then every ten minutes what [Retention] no
// longer keeps: by default a finished call a day after it finished, once
// its key (kept 24 hours) expired too, and delivered and cancelled effects
// after a week. Dead and unknown effects, and calls in state unknown, are
// never purged: they wait for an operator. [StartOptions.Retention] and
// [StartOptions.ReapInterval] change it, and a tool's own
// [ToolOptions.Retention] (Restate's per-handler retention) keeps its keys
// and its calls for other times than the layer's; [ReaperOff] leaves
// purging to something else (mcp-outbox purge). On PostgreSQL every
// replica runs a reaper; their batches do not collide.
//
// Destinations are checked where the mistake is made. Once Start runs a
// dispatcher, the layer knows its destinations: an Enqueue to any other
// name fails with an error that wraps [ErrUnknownDestination] and names the
// destination and the known ones, and enqueues nothing; a handler returns
// it like any other error. Start itself fails while effects are pending
// for a destination its dispatcher does not know, since they would wait
// forever; its error names the way out, mcp-outbox outbox retarget --from
// NAME --to NAME (or the admin API's retarget), which moves them to the right
// name. A layer started with [StartOptions.NoDispatcher] because another
// process delivers (mcp-outbox drain, or a replica) checks the names
// [StartOptions.KnownDestinations] gives, or accepts any name without them.
// A layer that was never started accepts any name too, and nothing in its
// process delivers: its first enqueue logs a warning, and package
// operator's /readyz, given the layer, reports degraded. Replicas on one
// PostgreSQL database must configure the same destinations.
//
// # Operators
//
// What an operator does to calls and effects (retry, cancel, settle an
// unknown effect or call, purge at once) is the admin API of package
// [github.com/mcp-outbox/mcp-outbox/outbox/operator] and the mcp-outbox
// command's outbox subcommands. Finished records are purged
// continuously by the reaper (see Lifecycle), which keeps what [Retention] says.
//
// # Data protection
//
// With [Options].Keys (package [github.com/mcp-outbox/mcp-outbox/outbox/seal];
// serve's --encryption-key-file) the layer seals, under a data key of the
// call's principal, every recorded result (error texts and structured
// content included), a task's stored arguments, and each effect's headers
// and body, and keeps no destination response; args_hash and fingerprints
// become HMACs under a key of the database's own, wrapped like the data
// keys. Keys, principals, tool names, states, times, effect destinations and
// paths stay in plaintext: they are what finds a call. A value that cannot be
// opened (changed, copied from another row, erased, or under a key the key
// file lacks) is answered as an error that says why, with the code
// "erased" or "unreadable" under [MetaKeyError] (never "not_recorded", which
// promises that a retry runs the call), and the call is never run again: its
// row exists. mcp-outbox encryption forget-principal erases a
// principal (crypto-erasure, see package seal); mcp-outbox encryption
// reencrypt rotates keys and seals the rows of a database used without
// encryption; mcp-outbox encryption decrypt turns it off.
// Rows written without keys stay readable with them; the reverse is
// refused: [New] without [Options].Keys on a database that holds data
// keys fails with [ErrKeyRequired], so encryption is never turned off but
// by mcp-outbox encryption decrypt.
//
// # On PostgreSQL
//
// The invariant is the same: a call's writes, its effects and its outcome
// commit in one transaction, as long as the tool's own tables live in the
// same database. What differs, and why (no group commit; the claim as the
// first statement of the call's transaction, three round trips for a
// fresh key; compare-and-set claims; leases judged by the database's
// clock; effects leased by one replica each), is told where PostgreSQL
// begins: the package doc of
// [github.com/mcp-outbox/mcp-outbox/schema/postgres].
//
// # Numbers in arguments
//
// The go-sdk validates a typed tool's arguments by decoding them into
// map[string]any, where every number becomes a float64, and hands the tool
// what that gives back. A number a float64 cannot hold would reach the tool
// changed, silently: {"amount": 9007199254740993} as 9007199254740992,
// 1e-400 as 0. So for tools registered with [AddTool] the layer refuses a
// call holding any number literal whose value does not survive that round
// trip, before claiming it: a tool error with code "invalid_arguments"
// under [MetaKeyError] names the argument (a JSON Pointer such as
// "/items/1/amount") and the value, and nothing runs or is recorded. Integers
// between -(2^53-1) and 2^53-1 and every number a client writes from a
// float64 (0.1, 1e20, -0) pass unchanged.
//
// Refusing, rather than carrying such literals through exactly, keeps the
// SDK's validation and decoding for every tool (carrying them would replace
// both, and the SDK's output step rounds structured results the same way),
// follows RFC 8259 and I-JSON (RFC 7493), which call such numbers not
// interoperable (JavaScript clients cannot send them at all), and turns a
// silent change into an error the client can correct: send the value as a
// string.
//
// # Traces
//
// With a TracerProvider ([Options.TracerProvider], nil meaning the global
// one) every request the server receives gets a SERVER span after the
// OpenTelemetry MCP conventions, whose parent is the trace context the
// client put in params._meta (SEP-414; [MetaCarrier] with OpenTelemetry's
// propagation.TraceContext puts it there from a Go client). An effect
// stores the traceparent of the span that enqueued it, and the
// [dispatch.Dispatcher] makes each delivery attempt a CLIENT span in that
// trace ([dispatch.Options.TracerProvider]),
// sending the attempt's traceparent to the destination. Keys appear only
// as hashes; arguments and results only with LogSensitive.
//
// Beside the conventions' mcp.* and gen_ai.* attributes, a tools/call span
// carries the layer's own:
//
//	mcp_outbox.key_source        where the key came from: meta, params, header,
//	                             argument or fingerprint ("" without a key)
//	mcp_outbox.outcome           executed, failed, replayed, joined, conflict,
//	                             in_progress, unknown or not_recorded, as in
//	                             the call event and mcp_outbox_calls_total
//	mcp_outbox.key_hash          the call's key as a hash (the first 12 hex
//	                             digits of SHA-256 over principal, NUL, key),
//	                             never the key: whoever holds a key can replay
//	                             the call; the logs and the operator page show
//	                             the same hash
//	mcp_outbox.call_id           the recorded call's id ("callId" in the
//	                             result's _meta under [MetaKeyCall])
//	mcp_outbox.effects_enqueued  how many effects the call enqueued
//	mcp_outbox.recorded          whether the tool's calls are recorded at all
//
// Of the conventions' attributes, gen_ai.tool.call.id is the model's id
// for the tool call when the host sent one (see Keys): the id of this
// request, so a replay's span names the retry's id.
//
// A delivery attempt's span carries the dispatcher's attributes, listed in
// package outbox/dispatch; both kinds of span share this package's
// instrumentation scope.
//
// # Keys
//
// The key of a call is the first found of: params._meta.idempotencyKey;
// params.idempotencyKey (SEP-3182, carried below the SDK by the fronts:
// mcpstdio.NewTransport on stdio, mcphttp's handler and LiftParamsKey on
// Streamable HTTP); the HTTP Idempotency-Key header; the tool's
// idempotency_key argument when its input schema declares one. Without any, the
// key is a fingerprint of principal, tool and canonical arguments, remembered
// for the tool's fingerprint window. Keys are scoped by principal, never by
// JSON-RPC id or session id, which do not survive a reconnect. The
// principal is stored as "user:" followed by the authenticated user's ID
// (the go-sdk's TokenInfo.UserID) on HTTP with authentication, and as
// "local" otherwise; the status tool, package query and the admin API name
// it so.
//
// The model's id for a tool call is not a key. Claude Code sends it in
// params._meta["claudecode/toolUseId"] (toolu_…), and a model that retries
// makes a new tool call with a new id, so the id never decides which call a
// request is: not in keys, not in fingerprints, not in conflicts. It is
// recorded for finding a call from a transcript: the call's row keeps the
// id of the attempt that claimed and ran it (calls.tool_call_id, toolCallId
// in the status tool's answer), and the call event (tool_call_id) and the
// span (gen_ai.tool.call.id) of every request carry its own, so a replay's
// name the retry. Only strings count (a number or an object there is
// ignored); control characters are dropped and an id longer than 200 bytes
// is cut to its first 200, at a character boundary.
//
// # Replays
//
// A replayed result, or a joined one (a retry that waited for the attempt
// still running the call and got its result), says so to the model: a last
// text block "[mcp-outbox] Replayed: ..." or "[mcp-outbox] Joined: ...",
// and the same text in the structured content under [ReplayNoteProperty]
// ("mcp_outbox") when the result has structured content that is a JSON
// object. Some clients show the model only the structured content (Claude
// Code does, and drops content and _meta), and strict clients validate it
// against the tool's output schema (the TypeScript SDK with AJV, the Python
// SDK with jsonschema; a Go struct's inferred schema forbids other
// properties). So [AddTool] lists "mcp_outbox" in every recorded tool's
// output schema as an optional string, and the proxy does the same to the
// upstream's tools it records; a first execution never sets it. A tool
// whose output schema is not a plain object schema (its root composes
// subschemas with oneOf, allOf, $ref and the like) keeps its schema, and
// its replays carry the note in content only. _meta[MetaKeyCall].replayed
// says the same to a program.
//
// # Several servers on one layer
//
// A layer may be installed on any number of servers ([Layer.NewServer] for
// each tenant, or for each request in the getServer of go-sdk's
// StreamableHTTPHandler), each with its own tools: [AddTool] registers a
// tool on one server, and a tool of the same name on another server may
// have another handler. A server that is no longer used leaves the layer
// when the garbage collector takes it. All servers of a layer share its
// key space, since a retry may reach another instance of the same server.
// Tenants whose calls must never meet each get a [ServerOptions.Tenant]:
// their calls are recorded under the caller's principal within the tenant
// ("tenant:NAME/PRINCIPAL"), so they never replay each other's results or
// block each other's keys, and the status tool sees its own tenant's calls
// only. A layer per tenant would not do: the keys live in the database the
// layers share.
package outbox
