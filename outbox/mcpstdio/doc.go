// Package mcpstdio is the stdio front of the outbox layer: [NewTransport]
// wraps a go-sdk transport so that a server of the layer keeps its session
// through a client's malformed lines, and finds the idempotency key a
// client put at the top of tools/call params.
//
//	server.Run(ctx, mcpstdio.NewTransport(&mcp.StdioTransport{}, nil))
//
// In the layers of this module mcpstdio is a surface on the library
// (outbox), beside mcphttp, its Streamable HTTP front.
package mcpstdio
