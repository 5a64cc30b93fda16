package dispatch

import "context"

// RoundForTest runs one dispatch round and waits for its attempts.
func (d *Dispatcher) RoundForTest(ctx context.Context) error {
	_, err := d.round(ctx, ctx)
	d.inflight.Wait()
	return err
}

// SetTestHooks sets functions the dispatcher calls when its
// PostgreSQL listener is listening and when Run is about to wait with no
// wake-up pending. Set them before Run.
func (d *Dispatcher) SetTestHooks(listening, idle func()) {
	d.testHookListening, d.testHookIdle = listening, idle
}
