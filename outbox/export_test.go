package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// RunReaper is the reaper Layer.Start runs, on the clock now.
func RunReaper(ctx context.Context, db *schema.DB, r Retention, interval time.Duration, logger *slog.Logger) error {
	return runReaper(ctx, db, r, interval, logger, time.Now)
}

// SetTestHookAfterCommit lets tests act between a call's commit and its response.
func SetTestHookAfterCommit(f func(context.Context)) { testHookAfterCommit = f }

// WaitingForTurn reports how many units wait for the writer's turn, so tests
// can tell that a batch will form.
func WaitingForTurn(l *Layer) int { return l.group.waiting() }

// InstallUntraced installs the layer on s as Install does, without the
// tracing middleware: the baseline of BenchmarkTracing.
func InstallUntraced(l *Layer, s *mcp.Server) {
	r, _ := l.register(s, "")
	s.AddReceivingMiddleware(l.middlewareFor(r))
	l.addStatusTool(s, "")
}

// TraceMiddleware is the layer's tracing middleware alone.
func TraceMiddleware(l *Layer) mcp.Middleware { return l.traceMiddleware }

// ServersOf reports how many servers the layer's registry holds.
func ServersOf(l *Layer) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.servers)
}

// WaitTasks waits until the tasks the layer runs have ended.
func WaitTasks(l *Layer) { l.taskRuns.Wait() }

// MaxTaskRuns bounds the runs of a task the store fails under.
const MaxTaskRuns = maxTaskRuns

// SetUnknownDestinationWatch sets how often a started layer looks for
// effects pending for unknown destinations, and a hook run after each look.
func SetUnknownDestinationWatch(every time.Duration, round func()) {
	unknownDestinationInterval, testHookUnknownDestinationRound = every, round
}

// Started reports whether a Start of l ever succeeded.
func Started(l *Layer) bool { return l.everStarted() }
