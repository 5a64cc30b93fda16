package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/defaults"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// ReaperOff as [StartOptions.ReapInterval] runs no reaper: something else
// purges (mcp-outbox purge from cron, another replica's reaper).
const ReaperOff time.Duration = -1

// ErrUnknownDestination is wrapped by the error of an Enqueue to a
// destination that the dispatcher of [Layer.Start] does not deliver to,
// and by Start's error when effects are pending for one.
var ErrUnknownDestination = errors.New("outbox: unknown destination")

// StartOptions configure [Layer.Start]. The zero value of each field
// selects the default documented on it.
type StartOptions struct {
	// Dispatcher configures the dispatcher Start runs, its Destinations
	// included: from Start on, the layer's Enqueue refuses every other
	// destination name with [ErrUnknownDestination]. Nil means the
	// dispatcher's defaults and no destinations, which suits a server
	// whose tools enqueue nothing: any Enqueue is then an error. In the
	// copy Start makes, nil Logger, Metrics, TracerProvider, Now and
	// Keys are the layer's (see [Options]).
	Dispatcher *dispatch.Options
	// NoDispatcher runs no dispatcher in this process: another one
	// delivers (mcp-outbox drain, or a replica on the same PostgreSQL
	// database), and the layer cannot know its destinations, so Enqueue
	// accepts any name, as a layer that was never started does. False
	// means a dispatcher runs. Dispatcher must then be nil.
	NoDispatcher bool
	// KnownDestinations, with NoDispatcher, names the destinations the
	// process that delivers is configured with. Enqueue then refuses any
	// other name with [ErrUnknownDestination], where the mistake is made,
	// rather than leaving an effect that no dispatcher will ever deliver,
	// and [Runner.Destinations] returns them, so that readiness (package
	// operator) reports effects pending for another name. Nil accepts any
	// name. Without NoDispatcher it must be nil: the Dispatcher's
	// Destinations are the set.
	KnownDestinations []string
	// Retention is what the reaper keeps (see [Retention]); its zero
	// value keeps calls for 24 hours after their key expires,
	// delivered and cancelled effects for 7 days.
	Retention Retention
	// ReapInterval is how often the reaper purges, beginning at Start;
	// zero means 10 minutes, ReaperOff runs no reaper.
	ReapInterval time.Duration
	// TaskScanInterval is how often the layer looks for tasks whose owner
	// is gone, to run them again (see "Tasks" in the package doc),
	// beginning at Start; zero means 10 s or the
	// layer's lease, whichever is shorter; negative runs no scan.
	TaskScanInterval time.Duration
}

// A Runner is the background work that [Layer.Start] began: the dispatcher
// and the reaper. Stop it with [Runner.Stop] before closing the database.
type Runner struct {
	layer      *Layer
	dispatcher *dispatch.Dispatcher // nil with NoDispatcher
	cancel     context.CancelFunc
	removeHook func()
	done       chan struct{} // closed once the dispatcher and the reaper returned
	err        error         // theirs; read after done
	stopOnce   sync.Once
	stopped    atomic.Bool
	started    bool     // Start returned it; guarded by layer.mu
	known      []string // StartOptions.KnownDestinations, sorted
}

// Start begins what a server needs beside the layer, and returns at once:
//
//   - a [dispatch.Dispatcher] for opts.Dispatcher's destinations (unless
//     NoDispatcher), which delivers at once what a previous run left, and
//     from then on is woken by every commit that enqueued effects
//     (Start adds its Notify with [Layer.OnEnqueue]);
//   - the reaper (the reaper, on the layer's clock), which purges at once
//     and then every ReapInterval what opts.Retention no longer keeps, so
//     that the tables do not grow without bound (unless ReaperOff);
//   - the task runner, which takes over the tasks whose owner is gone and
//     runs them again from their stored params, at once and every
//     TaskScanInterval (see "Tasks" in the package doc).
//
// From Start on, Enqueue to a destination the dispatcher does not know is
// an error that names the destination and the known ones, and enqueues
// nothing; with NoDispatcher any name is accepted, as before Start,
// unless StartOptions.KnownDestinations names the deliverer's set. A
// layer never started logs a warning at its first commit that enqueued
// effects: nothing in its process delivers them.
//
// Start fails, and starts nothing, when effects are pending for a
// destination the dispatcher does not know: they would wait forever,
// silently. Its error names the way out: move them to the right name
// (mcp-outbox outbox retarget --from NAME --to NAME, or
// the admin API), cancel them (mcp-outbox outbox cancel --dest
// NAME), configure the destination, or use NoDispatcher if another
// process delivers them. Effects that reach the database for such a name
// while the dispatcher runs (a cooperating upstream of the proxy writes
// its own) are logged, once per name, within a minute.
// Replicas on one PostgreSQL database must configure the same
// destinations, for the same reason. A second Start before Stop is an
// error; after Stop the layer can be started again.
//
// ctx bounds Start's own work; its values (not its cancellation) reach the
// background work, which runs until [Runner.Stop]. So the shutdown order
// is the caller's: stop serving and let calls in flight finish (for
// HTTP, mcphttp.Serve does this when its context ends), then Stop, then
// close the database. Effects that calls commit after Stop are delivered
// at the next Start.
func (l *Layer) Start(ctx context.Context, opts *StartOptions) (*Runner, error) {
	var o StartOptions
	if opts != nil {
		o = *opts
	}
	if o.NoDispatcher && o.Dispatcher != nil {
		return nil, errors.New("start outbox: StartOptions has both Dispatcher and NoDispatcher; choose one")
	}
	if o.KnownDestinations != nil && !o.NoDispatcher {
		return nil, errors.New("start outbox: StartOptions.KnownDestinations is for NoDispatcher; " +
			"a dispatcher's destinations are those of Dispatcher.Destinations")
	}
	if slices.Contains(o.KnownDestinations, "") {
		return nil, errors.New("start outbox: StartOptions.KnownDestinations has an empty name")
	}
	if o.ReapInterval < 0 && o.ReapInterval != ReaperOff {
		return nil, fmt.Errorf("start outbox: negative reap interval %s (ReaperOff turns the reaper off)", o.ReapInterval)
	}
	if o.ReapInterval == 0 {
		o.ReapInterval = defaults.ReapInterval
	}
	// Checked here, so that a bad retention fails Start rather than
	// the reaper's goroutine later.
	if _, err := o.Retention.ages(); err != nil {
		return nil, fmt.Errorf("start outbox: %w", err)
	}

	l.mu.Lock()
	if l.runner != nil {
		l.mu.Unlock()
		return nil, errors.New("start outbox: the layer is already started; call Stop first")
	}
	r := &Runner{layer: l, done: make(chan struct{})}
	l.runner = r // held while Start checks, so that a concurrent Start fails
	l.mu.Unlock()
	fail := func(err error) (*Runner, error) {
		l.mu.Lock()
		l.runner = nil
		l.mu.Unlock()
		return nil, err
	}

	if !o.NoDispatcher {
		var do dispatch.Options
		if o.Dispatcher != nil {
			do = *o.Dispatcher
		}
		if do.Logger == nil {
			do.Logger = l.opts.Logger
		}
		if do.Metrics == nil {
			do.Metrics = l.opts.Metrics
		}
		if do.TracerProvider == nil {
			do.TracerProvider = l.opts.TracerProvider
		}
		if do.Now == nil {
			do.Now = l.now
		}
		if do.Keys == nil {
			do.Keys = l.opts.Keys
		}
		d, err := dispatch.New(l.db, &do)
		if err != nil {
			return fail(fmt.Errorf("start dispatcher: %w", err))
		}
		// The set first, then the check: an Enqueue from now on is
		// refused, so a pending effect the check does not see was
		// committed by a call that enqueued before Start.
		old := l.known.Swap(newDestSet(d.Destinations(), "this process's dispatcher delivers to"))
		if err := l.checkPending(ctx, d); err != nil {
			l.known.Store(old)
			return fail(err)
		}
		r.dispatcher = d
	} else if o.KnownDestinations != nil {
		r.known = slices.Compact(slices.Sorted(slices.Values(o.KnownDestinations)))
		l.known.Store(newDestSet(r.known, "StartOptions.KnownDestinations names"))
	} else {
		l.known.Store(nil) // forget the set of an earlier Start
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	var wg sync.WaitGroup
	var dispatchErr, reapErr error
	if d := r.dispatcher; d != nil {
		r.removeHook = l.addEnqueueHook(d.Notify)
		wg.Go(func() { dispatchErr = d.Run(runCtx) })
		wg.Go(func() { l.watchUnknownDestinations(runCtx, d) })
	}
	if o.TaskScanInterval >= 0 {
		scan := o.TaskScanInterval
		if scan == 0 {
			// A task may be taken over once its lease passed: no point in
			// looking much less often than that.
			scan = min(defaults.TaskScanInterval, l.opts.Lease)
		}
		wg.Go(func() { _ = l.runTaskRecovery(runCtx, scan) })
	}
	if o.ReapInterval != ReaperOff {
		wg.Go(func() {
			reapErr = runReaper(runCtx, l.db, o.Retention, o.ReapInterval, l.opts.Logger, l.now)
		})
	}
	go func() {
		wg.Wait()
		r.err = errors.Join(dispatchErr, reapErr)
		close(r.done)
	}()
	// Only now: a Start that failed leaves the layer unstarted, so that
	// its first enqueue still warns and readiness still says so.
	l.mu.Lock()
	l.started, r.started = true, true
	l.mu.Unlock()
	return r, nil
}

// Runner returns the Runner of the layer's running Start: nil before the
// first Start, while a Start is still checking, and after Stop.
func (l *Layer) Runner() *Runner {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runner == nil || !l.runner.started {
		return nil
	}
	return l.runner
}

// everStarted reports whether a Start of the layer ever succeeded, with a
// dispatcher or NoDispatcher. A layer never started delivers nothing it
// enqueues, and nothing else in its process says so: it logs a warning at
// its first enqueue, and package operator's readiness check
// (Options.Layer) reports it degraded.
func (l *Layer) everStarted() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started
}

// Stop stops the dispatcher and the reaper and returns once both have
// returned; no goroutine of Start outlives it. The dispatcher claims
// nothing more and releases what it claimed but had not sent; deliveries
// in flight may finish until ctx ends or the dispatcher's ShutdownTimeout
// passes, whichever comes first. Then they are cancelled: such an effect
// is sent again, with the same Idempotency-Key, at the next Start, or
// becomes unknown if its destination is AtMostOnce. Stop's error then
// says that ctx ended. Then Stop waits for the tasks the layer runs, until
// ctx ends; the rest are stopped, roll back, and stay in flight for the
// next Start or another replica to run again. Stop may be called again: it
// waits in the same way.
// After Stop the layer still refuses the destinations the stopped
// dispatcher did not know; a Start with NoDispatcher forgets them.
func (r *Runner) Stop(ctx context.Context) error {
	r.stopOnce.Do(func() {
		r.stopped.Store(true)
		if r.removeHook != nil {
			r.removeHook()
		}
		r.cancel()
	})
	var err error
	select {
	case <-r.done:
	case <-ctx.Done():
		if r.dispatcher != nil {
			r.dispatcher.CancelInFlight()
		}
		<-r.done
		err = fmt.Errorf("stop outbox: deliveries in flight were cancelled: %w", ctx.Err())
	}
	err = errors.Join(err, r.layer.stopTasks(ctx))
	l := r.layer
	l.mu.Lock()
	if l.runner == r {
		l.runner = nil
	}
	l.mu.Unlock()
	return errors.Join(err, r.err)
}

// Running reports whether the work of Start runs: Stop was not called,
// and the dispatcher, if there is one, is delivering. It suits the
// readiness check of package operator (Options.Dispatcher).
func (r *Runner) Running() bool {
	if r.stopped.Load() {
		return false
	}
	return r.dispatcher == nil || r.dispatcher.Running()
}

// Destinations returns the names the started dispatcher delivers to,
// sorted; with NoDispatcher, StartOptions.KnownDestinations, or nil
// without them (another process delivers, so this one cannot tell which
// names are configured). With Running it makes the
// Runner what package operator's Options.Dispatcher wants: readiness then
// reports effects pending for a name outside this set.
func (r *Runner) Destinations() []string {
	if r.dispatcher == nil {
		return slices.Clone(r.known)
	}
	return r.dispatcher.Destinations()
}

// Notify wakes the started dispatcher at once, as a commit that enqueued
// effects through a tool call does. Call it after committing a
// transaction in which [Layer.EnqueueTx] enqueued effects: on SQLite the
// dispatcher would otherwise find them at its next poll. With
// NoDispatcher, or after Stop, it does nothing.
func (r *Runner) Notify() {
	if r.dispatcher != nil && !r.stopped.Load() {
		r.dispatcher.Notify()
	}
}

// pendingByDestination reads the pending effects per destination: the
// state index finds them without reading the delivered ones.
const pendingByDestination = `
SELECT destination, count(*) FROM effects WHERE state = 'pending' GROUP BY destination ORDER BY destination`

// checkPending fails when effects are pending for destinations d does not
// deliver to.
func (l *Layer) checkPending(ctx context.Context, d *dispatch.Dispatcher) error {
	rows, err := l.db.Read.QueryContext(ctx, pendingByDestination)
	if err != nil {
		return fmt.Errorf("start outbox: count pending effects: %w", err)
	}
	defer rows.Close()
	known := newDestSet(d.Destinations(), "")
	var unknown, names []string
	for rows.Next() {
		var (
			dest string
			n    int64
		)
		if err := rows.Scan(&dest, &n); err != nil {
			return fmt.Errorf("start outbox: count pending effects: %w", err)
		}
		if !known.names[dest] {
			unknown = append(unknown, fmt.Sprintf("%q (%d)", dest, n))
			names = append(names, dest)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("start outbox: count pending effects: %w", err)
	}
	if len(unknown) == 0 {
		return nil
	}
	return fmt.Errorf("start outbox: effects are pending for destinations the dispatcher does not know: %s; "+
		"the dispatcher knows %s. Move them to the right destination (%s), cancel them (mcp-outbox outbox cancel --dest NAME), "+
		"configure the destination, or set StartOptions.NoDispatcher if another process delivers them: %w",
		strings.Join(unknown, ", "), known.list, retargetHint(names), ErrUnknownDestination)
}

// retargetHint is the command that moves the effects of names, the way
// out of a refused Start that a typo in Enqueue leads to. A name that a
// shell would split or expand is quoted for it.
func retargetHint(names []string) string {
	var cmds []string
	for i, n := range names {
		if i == 3 {
			cmds = append(cmds, "…")
			break
		}
		cmds = append(cmds, "mcp-outbox outbox retarget --from "+shellWord(n)+" --to NAME")
	}
	return strings.Join(cmds, "; ")
}

// shellWord quotes s for a POSIX shell unless it is plain.
func shellWord(s string) string {
	plain := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:/@", r))
	}) < 0
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// destSet is the destinations of the dispatcher that Start runs, or
// those StartOptions.KnownDestinations names.
type destSet struct {
	names map[string]bool
	list  string // for errors: "a", "b", or none
	whose string // for errors: who names them, before the list
}

func newDestSet(names []string, whose string) *destSet {
	s := &destSet{names: map[string]bool{}, whose: whose}
	var quoted []string
	for _, name := range names {
		s.names[name] = true
		quoted = append(quoted, fmt.Sprintf("%q", name))
	}
	slices.Sort(quoted)
	s.list = strings.Join(quoted, ", ")
	if s.list == "" {
		s.list = "none"
	}
	return s
}

// checkDestination refuses a destination that the dispatcher of Start does
// not deliver to, or that StartOptions.KnownDestinations does not name;
// before Start, or with NoDispatcher alone, the layer does not know the
// deliverer's set and accepts any name. Every way of enqueueing
// calls it before writing anything.
func (l *Layer) checkDestination(name string) error {
	s := l.known.Load()
	if s == nil || s.names[name] {
		return nil
	}
	return fmt.Errorf("%w %q: %s %s; nothing was enqueued",
		ErrUnknownDestination, name, s.whose, s.list)
}

// enqueueHook is one function of OnEnqueue; a pointer, so that the one
// Start added can be removed by identity.
type enqueueHook struct{ f func() }

// addEnqueueHook adds f to the functions that l.notify calls, and returns
// a function that removes it again.
func (l *Layer) addEnqueueHook(f func()) (remove func()) {
	h := &enqueueHook{f}
	l.mu.Lock()
	l.hooks = append(slices.Clone(l.hooks), h)
	l.setNotifyLocked()
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.hooks = slices.DeleteFunc(slices.Clone(l.hooks), func(x *enqueueHook) bool { return x == h })
		l.setNotifyLocked()
		l.mu.Unlock()
	}
}

// setNotifyLocked makes l.notify call every hook. The commit path reads
// l.notify under l.mu and calls it outside, so it gets a slice that is
// never changed afterwards.
func (l *Layer) setNotifyLocked() {
	hooks := l.hooks
	switch len(hooks) {
	case 0:
		l.notify = nil
	case 1:
		l.notify = hooks[0].f
	default:
		l.notify = func() {
			for _, h := range hooks {
				h.f()
			}
		}
	}
}

// enqueued runs after a commit that enqueued effects: it wakes the
// dispatcher (l.notify). A layer never started, with no OnEnqueue
// function, has no dispatcher to wake; that is right when another process
// delivers, but a stranger who forgot Start saw every effect stay pending
// and nothing said so. So the first such commit logs it.
func (l *Layer) enqueued() {
	l.mu.Lock()
	notify, started := l.notify, l.started
	l.mu.Unlock()
	if notify != nil {
		notify()
		return
	}
	if !started && l.warnedUndelivered.CompareAndSwap(false, true) {
		l.logger.Warn("effects were enqueued, and this process does not deliver them: the layer was not started " +
			"(Layer.Start runs the dispatcher); they stay pending until a dispatcher on this database runs " +
			"(Layer.Start, or mcp-outbox serve, proxy or drain with --dest)")
	}
}
