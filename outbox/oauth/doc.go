// Package oauth makes an MCP endpoint an OAuth 2.1 resource server, as the
// MCP authorization spec (2025-11-25, 2026-07-28) asks of an HTTP server
// that authorizes:
//
//   - it publishes RFC 9728 Protected Resource Metadata naming its
//     authorization server ([ResourceServer.MetadataHandler], at the paths
//     [ResourceServer.MetadataPaths]);
//   - it answers a request without a valid token with 401 and
//     'WWW-Authenticate: Bearer resource_metadata="…"', so that a client
//     that knows only the server's URL finds where to get a token, and a
//     token without a required scope with 403 error="insufficient_scope";
//   - it accepts only JWT access tokens signed by the issuer's keys (its
//     JWKS, found through its RFC 8414 or OpenID Connect discovery
//     document), issued for this resource (aud, RFC 8707), and valid now.
//
// The principal of a token is its issuer and subject,
// "oauth:ISSUER#SUBJECT" (the go-sdk's TokenInfo.UserID), so that two
// issuers' subjects never collide: the outbox layer scopes idempotency
// keys, call_status and tasks by it.
//
// Per-tool scopes ([Options.ToolScopes]) are checked on the HTTP request,
// before the MCP server reads it: a tools/call without them is answered
// 403 insufficient_scope, which is what a client's step-up authorization
// reacts to, and no part of the call runs or is recorded.
//
// The verifier takes JSON Web Tokens apart with github.com/go-jose/go-jose/v4
// and writes no cryptography of its own. Package bearer writes the
// challenges; this package imports nothing of the outbox layer.
package oauth
