// Package operator is the operator surface of an MCP server built on the
// outbox: what a person, a load balancer or Prometheus uses to see and
// repair the state of the calls and their effects. It has four parts, each
// an http.Handler from a constructor of its own, to mount where you like:
//
//   - [NewHealth]: GET healthz (the process serves) and GET readyz (the
//     database takes writes and has this binary's schema, and the
//     dispatcher runs). readyz says "degraded", still 200, naming the
//     destinations, when effects are pending for a destination the
//     dispatcher does not deliver to: a mistyped or dropped destination
//     would otherwise wait forever without a word. Its reasons are generic;
//     database errors go to the log.
//   - [NewMetricsHandler]: the Prometheus scrape, with the outbox depth and
//     mcp_outbox_effects_unconfigured (pending effects per unknown
//     destination), serving the registry given to outbox.NewMetrics.
//   - [NewAdmin]: the admin API, JSON: counts by state, effects listed and
//     read, retry, cancel and resolve of an effect, retry of every dead
//     one, the calls in state unknown and their settlement.
//   - [NewPage]: the operator page, the same server-rendered, no script,
//     with a login that trades the admin token for a session cookie. It
//     names the unconfigured destinations too.
//
// [NewHandler] mounts all four under one prefix, for the common case.
//
// # Mounting
//
// Options.BasePath is where a handler is mounted, "/" by default. Links,
// form actions, redirects and the session cookie's path start with it, so
// the page works under a prefix such as /ops/ behind a reverse proxy that
// routes by path. A handler accepts its paths with the prefix (chi's Mount,
// http.ServeMux) or with the prefix already stripped (http.StripPrefix):
//
//	running, err := layer.Start(ctx, startOpts) // an *outbox.Runner; Stop it at shutdown
//	...
//	ops, err := operator.NewHandler(ctx, db, &operator.Options{BasePath: "/ops/", AdminTokenSHA256: hash, Layer: layer})
//	mux.Handle("/ops/", ops)
//
// With Options.Layer, /readyz follows the layer's Start: degraded (still
// 200) while it was never started, since nothing then delivers what its
// calls enqueue.
//
// # Who may use it
//
// Without an admin token (Options.AdminTokenSHA256, the SHA-256 that
// bearer.Hash gives) everything but the health checks answers clients on
// this host only, over loopback and addressed by a loopback name; with one,
// anyone who presents it, in the Authorization header or (the page)
// through a login session. Cross-origin browser requests are refused
// either way.
//
// With Options.OAuth, OAuth access tokens get in too, in the Authorization
// header and from any address, by scope: the views (the admin API's GETs,
// the metrics, the page and its lookup) need OAuth.ReadScope, the actions
// OAuth.ActScope, which grants the views as well. A token is verified as
// /mcp's are (issuer, audience, expiry, signature: pass
// (*oauth.ResourceServer).Verify); without the scope it gets 403
// error="insufficient_scope" naming it. The admin token still admits as
// before; the loopback rule is off, because a TLS-terminating proxy on the
// same host, common in front of a server behind an identity provider,
// would make every tokenless client look local. The page's login form
// takes the admin token only: a browser
// cannot send an access token by itself, and pasting one into a form
// would make a session outlive the token; a browser behind a proxy that
// adds the header is judged by the token on every request. Every action is
// logged with who did it ("by": the token's principal, "admin token",
// "session" or "loopback").
//
// # Sessions and keys, across replicas
//
// Page sessions are cookies signed with HMAC-SHA256, carrying their expiry
// (12 hours) and bound to the admin token: any replica verifies them
// without asking the one that issued them, so a round-robin balancer needs
// no sticky sessions. A logout is recorded in the database (table
// operator_logouts), so it ends the session on every replica. The flash
// message an action redirects with is signed with a key derived from the
// same key.
//
// The key is Options.SessionKey (at least 32 bytes, the same on every
// replica). Without one, [NewPage] uses the key kept in the database, in
// table operator_secret, which the first process to need it generates;
// every replica on that database finds the same key. NewPage logs where the
// key is kept ("operator page session key", kept_in=...). A new key, or a
// new admin token, ends every session: delete the operator_secret row and
// restart, or configure another key.
//
// Wrong admin tokens, at the login form and in the Authorization header
// alike, and refused OAuth tokens are limited per client address: after 5
// in a minute the client gets 429 with Retry-After until the minute ends,
// its token unchecked, unless that token was accepted within the last
// hour (an OAuth token: and has not expired since). A client address is
// the TCP peer, so behind a reverse proxy it is every client's: a guesser
// there cannot lock out an operator whose token worked before, but an
// operator's first attempt during the guessing gets 429 too. The limit is kept in each process's memory, not
// across replicas, on purpose: the admin token is a random 256-bit secret
// that no rate of guessing finds, so the limit only keeps a guesser from
// flooding the log and burning CPU, which a limit per process does;
// sharing it would put a database write of unauthenticated clients on
// SQLite's one writer. The failures are logged as a count per minute
// ("failed authentications"), and a warning names the first clients to
// reach the limit, never a line per guess.
//
// In the layers of this module operator is a surface on the library
// (outbox, query, schema), beside mcphttp and sidecar.
package operator
