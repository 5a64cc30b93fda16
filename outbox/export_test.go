package outbox

import "context"

// SetTestHookAfterCommit lets tests act between a call's commit and its response.
func SetTestHookAfterCommit(f func(context.Context)) { testHookAfterCommit = f }

// RoundForTest runs one dispatch round and waits for its attempts.
func (d *Dispatcher) RoundForTest(ctx context.Context) error {
	_, err := d.round(ctx, ctx)
	d.inflight.Wait()
	return err
}

// WaitingForTurn reports how many units wait for the writer's turn, so tests
// can tell that a batch will form.
func WaitingForTurn(l *Layer) int { return l.group.waiting() }
