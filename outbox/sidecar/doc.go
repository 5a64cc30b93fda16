// Package sidecar puts the outbox layer in front of an MCP tool server written
// in any language: the sidecar of `mcp-outbox proxy`.
//
// The proxy works on JSON-RPC messages, not on a go-sdk server, so that
// everything it does not handle passes through as the upstream sent it:
// resources, prompts, notifications, progress, requests from the server to
// the client, methods this code has never heard of. It handles four things:
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
