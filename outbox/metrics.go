package outbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
)

// Outcomes of a call, the outcome label of mcp_outbox_calls_total.
const (
	outcomeExecuted    = "executed"     // the handler ran and its result committed
	outcomeReplayed    = "replayed"     // a retry of a finished call got the recorded result
	outcomeJoined      = "joined"       // a duplicate waited for the running original and got its result
	outcomeConflict    = "conflict"     // the key named another call; nothing ran
	outcomeInProgress  = "in_progress"  // the original was still running (or took the call over)
	outcomeNotRecorded = "not_recorded" // nothing committed; a retry runs the call
	outcomeFailed      = "failed"       // the handler's tool error committed as the outcome
	outcomeUnknown     = "unknown"      // the call's outcome was lost; it is not run again
	outcomeTask        = "task"         // answered with a task (CreateTaskResult); the task runs on
)

// Metrics are the Prometheus metrics of layers and dispatchers. Create them
// once per registry with [NewMetrics] and pass them in [Options] and
// dispatch.Options (package outbox/dispatch). A nil *Metrics records
// nothing, so the library needs no Prometheus setup.
type Metrics = metrics.Metrics

// NewMetrics creates the metrics and registers them with reg (when reg is
// not nil). It panics if they are already registered there, as
// prometheus.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics { return metrics.New(reg) }
