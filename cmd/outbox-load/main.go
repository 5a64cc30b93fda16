// Command outbox-load measures mcp-outbox from outside, as a user's load
// arrives: servers run as processes of their own, and this process is the
// load: N concurrent go-sdk clients over Streamable HTTP (stateless,
// 2026-07-28), each call a charge with a fresh _meta.idempotencyKey.
//
// Its one comparison today is the store of several replicas (issue 14):
// on a throwaway PostgreSQL cluster (fsync on), in alternating rounds,
//
//	bare, tx     a go-sdk server with the same charge tool and no layer,
//	             writing each charge in one transaction of its own: what a
//	             careful user writes without the layer (this binary, re-run
//	             as a server)
//	layer x1     mcp-outbox serve --http --db postgres://...
//	layer xN     N such replicas on the one database, the clients spread
//	             over them as a load balancer would
//
// and prints calls per second, median, p99 and largest latency, and the servers'
// CPU time per call. See outbox-load --help.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == serveBareCommand {
		os.Exit(serveBare(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var code int
	if len(os.Args) > 1 && os.Args[1] == amplifyCommand {
		code = runAmplify(ctx, os.Args[2:], os.Stdout, os.Stderr)
	} else {
		code = run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}
	stop()
	os.Exit(code)
}
