// Package bearer authenticates MCP clients over Streamable HTTP by static
// bearer tokens, each naming a principal: the principal the outbox layer
// scopes idempotency keys and call_status by.
//
// Tokens are never stored in clear. A tokens file holds one line per
// token, 'PRINCIPAL SHA256HEX' ([ParseFile]); the same pairs fit in one
// environment variable as 'principal=sha256hex,...' ([ParseEnv]). A
// [Verifier] checks a request's token against every hash in constant time
// and is a go-sdk auth.TokenVerifier; [Verifier.Require] wraps an MCP
// handler.
//
// [Require] is RFC 6750's side of any bearer scheme: it runs a go-sdk
// auth.TokenVerifier and answers what a client can act on, a 401 with a
// WWW-Authenticate challenge (naming the RFC 9728 metadata when there is
// one, and error="invalid_token" when a token came), a 403
// error="insufficient_scope" with the scopes, and never the token or the
// verifier's internal errors; and a 429 to a client address whose
// tokens were refused 20 times within a minute, before its next token
// is looked at. Package oauth uses it for access tokens.
//
// In the layers of this module bearer sits with the surfaces (operator,
// mcphttp, sidecar), and imports nothing of the library.
package bearer
