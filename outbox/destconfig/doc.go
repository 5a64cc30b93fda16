// Package destconfig reads the destinations of an outbox dispatcher
// (dispatch.Options.Destinations) from the environment and from
// command-line flags, in the syntax mcp-outbox's serve, proxy and drain
// take:
//
//	--dest 'payments=https://api.example.test;timeout=3s;max_attempts=5'
//	MCP_OUTBOX_DEST_PAYMENTS=https://api.example.test
//	MCP_OUTBOX_DEST_PAYMENTS_AUTH='Bearer sk_live_...'
//
// [Parse] merges the two, and refuses a setting every delivery would fail
// on (a URL without a host, a header name net/http refuses, a probe that is
// not a path) at start-up instead. A credential is read from the
// environment only, never from a flag, where it would show in the process
// list and the shell's history. [Help] describes the syntax for a usage
// text.
//
// A server built on the library that wants the same configuration imports
// it; one that configures destinations otherwise builds dispatch.Destination
// values itself. In the layers of this module destconfig is a surface on
// the library (outbox), beside bearer, which reads the tokens file.
package destconfig
