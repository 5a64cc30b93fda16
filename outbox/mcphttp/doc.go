// Package mcphttp serves a go-sdk MCP server over Streamable HTTP the way
// the outbox needs it: one endpoint for both protocol generations, routed
// by the Mcp-Protocol-Version header (stateful sessions up to 2025-11-25,
// stateless requests from 2026-07-28, which the go-sdk serves only from a
// stateless handler), with a top-level params.idempotencyKey lifted into
// _meta before the SDK drops it ([LiftParamsKey], which an endpoint of
// your own can use too), and a web page of another origin refused
// (Options.AllowedOrigins). [Serve] and [ServeWith] run an http.Server until
// their context ends, then shut it down gracefully: they wait for the calls
// in flight up to a bound, and hand over those still running. While they
// serve, they bound the time of a request's body (408), idle keep-alive
// connections, and the connections open per client address and in total
// (503): see [ServeWith].
//
// It is the HTTP front of `mcp-outbox serve`: mount [NewHandler] at /mcp,
// behind bearer.Verifier.Require when clients authenticate, and the
// operator surface (package operator) at the root.
//
// In the layers of this module mcphttp is a surface on the library
// (outbox), beside mcpstdio, its stdio front, and operator and sidecar.
package mcphttp
