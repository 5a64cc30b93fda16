// Package operator is the operator surface of an MCP server built on the
// outbox: what a person (or a load balancer, or Prometheus) uses to see and
// repair the state of the calls and their effects. [NewHandler] serves it
// all on one http.Handler, mountable at the root of chi or http.ServeMux
// beside the MCP endpoint:
//
//   - the admin API under /admin, JSON: counts by state, effects listed and
//     read, retry, cancel and resolve of an effect, retry of every dead one,
//     the calls in state unknown and their settlement (admin.go lists the
//     routes);
//   - the operator page at /: the same, server-rendered, no script, with a
//     login at /login that trades the admin token for a session cookie, and
//     a limit on failed logins per client;
//   - GET /healthz and GET /readyz (database writable and current,
//     dispatcher running);
//   - GET /metrics, from [NewMetrics].
//
// Without an admin token (Options.AdminTokenSHA256, the SHA-256 that
// bearer.Hash gives) everything but the health checks answers clients on
// this host only, over loopback and addressed by a loopback name; with one,
// anyone who presents it. Cross-origin browser requests are refused either
// way.
//
// The same actions are exported for a command line ([FindEffectAction],
// [ApplyEffectAction], [ResolveUnknownCall], ...), so that the command
// line, the API and the page accept and refuse exactly the same things;
// [WriteEffectTable] and [WriteUnknownCallTable] print the lists for a
// terminal.
//
// In the layers of this module operator is a surface on the library
// (outbox, query, schema), beside mcphttp and sidecar.
package operator
