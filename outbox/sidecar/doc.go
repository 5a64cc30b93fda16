// Package sidecar puts the outbox layer in front of an MCP tool server written
// in any language: the sidecar of `mcp-outbox proxy`.
//
// The proxy works on JSON-RPC messages, not on a go-sdk server, so that
// everything it does not handle passes through as the upstream sent it:
// resources, prompts, notifications, progress, requests from the server to
// the client, methods this code has never heard of. It handles these:
//
//   - tools/call runs through the layer: the call is
//     claimed in the shared database before it is forwarded, with the
//     claim in params._meta ("io.github.mcp-outbox/claim", described in
//     schema/README.md); retries are replayed,
//     duplicates wait for the original.
//   - tools/call of the status tool is answered by the proxy.
//   - tools/list gets the status tool appended, and tells the proxy each
//     tool's annotations (which decide whether its calls are recorded). The
//     output schema of each recorded tool gains the optional string
//     property "mcp_outbox" (outbox.ReplayNoteProperty), where a replay's
//     structured content tells the model it is one; every other member of
//     the listing passes as the upstream wrote it.
//   - initialize advertises the layer under capabilities.experimental.
//   - with Options.Tasks, the calls of the named tools become tasks of the
//     2026-07-28 Tasks extension: server/discover lists the extension (as
//     {}); a tools/call that declares it is answered with CreateTaskResult
//     once the task's row is durable, and forwarded over an upstream
//     session of the proxy's own (task_session.go), detached from the
//     client's request and session; tasks/get, tasks/update and
//     tasks/cancel are answered from the database, scoped by principal,
//     never forwarded (over HTTP, before the go-sdk's transport, which
//     refuses methods it does not know: task_http.go). A session made by
//     initialize at 2025-11-25 gets that revision's Tasks instead
//     (task_2025.go): initialize lists capabilities.tasks, tools/list
//     execution.taskSupport, a tools/call with params.task becomes a task,
//     and tasks/get, tasks/result, tasks/list and tasks/cancel are answered
//     from the database, in the layer's 2025-11-25 shapes. Without
//     Options.Tasks they pass through to the upstream, whose own tasks
//     they may be.
//
// What a task through the proxy survives, and how it ends (see
// outbox/task_remote.go): a retry of the same call gets the same task. If
// the proxy dies, the layer's task runner in the next proxy on the database
// (Layer.Start) takes the task over: with a cooperating upstream it
// forwards the stored params again under a new claim, and the upstream's
// fence lets only one attempt commit; with any other upstream the call may
// have run, so it becomes unknown (tasks/get: failed, the error says the
// outcome is unknown) and is never forwarded twice, as a lost forward of a
// plain call. If the upstream dies (or its connection breaks) under a
// cooperating task before anything committed, the task is forwarded again
// under the same claim once the upstream is back. tasks/cancel before the forward was written ends the task
// cancelled; after, it passes notifications/cancelled on to the upstream:
// a cooperating upstream's commit then fails its fence (the claim is
// released) and the task ends cancelled, unless it committed first; any
// other upstream may do the work all the same, so the task ends unknown,
// never cancelled. A cancel that reaches another proxy on the database (or
// the same one after a restart) takes a cooperating task's claim there and
// ends it cancelled at once: the upstream's fence, which checks the owner,
// then refuses its commit.
//
// Over Streamable HTTP, a session is made by initialize (2025-11-25 and
// before); a 2026-07-28 request, which has no session, is answered over
// one long-lived session of the proxy's own for all of them
// (http_stateless.go), with an upstream connection that is not
// initialized, as on stdio.
//
// Request ids towards the upstream are the proxy's own, so that its own
// requests (re-initializing a restarted upstream) never collide with the
// client's, and answers are mapped back to the client's ids.
//
// An upstream that dies is started again with backoff and initialized with
// the client's own initialize request, without the client noticing more
// than the requests that were in flight: those get an error, and forwarded
// tool calls are settled by the layer.
//
// Use it to put the outbox in front of a tool server you cannot link Go
// into: [New] takes the layer on the shared database (an SQLite file, or
// PostgreSQL) and a [Dialer] for the upstream ([Command] starts a process
// and speaks stdio to it, [HTTP] speaks Streamable HTTP); [Proxy.Serve]
// serves one client connection and [Proxy.HTTPHandler] serves Streamable
// HTTP clients. A cooperating
// upstream (Options.Cooperating) records its own outcomes in the contract's
// tables (schema/README.md, the modules in testdata/ts-upstream and
// testdata/py-upstream), which turns a lost outcome into a known one.
//
// In the layers of this module the sidecar is a surface on the library
// (outbox, query, schema), beside the operator surface and mcphttp;
// cmd/mcp-outbox's proxy command only parses flags and wires it up.
package sidecar
