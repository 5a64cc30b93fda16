// Command outbox-bench runs the performance measurements of mcp-outbox, each
// side by side with its baseline in the same run, and prints a table (or
// JSON) of figure, baseline, ratio, target and whether it is met. See
// `outbox-bench --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
