// Package nemesis schedules faults over a set of replicas from a seed, the
// way Jepsen's nemesis does, so that a failing run reproduces: the same
// seed gives the same faults, on the same replicas, at the same offsets
// from the start (what the system does in between still varies with the
// machine's timing).
//
// A schedule is a sequence of episodes: a fault, its hold, the heal, then
// a quiet gap in which the system can recover. With [Options.Overlap] a
// fault may start while another holds, on another replica, so that two
// faults meet (a slow link while a replica is paused, a partition while
// another replica's clock is off). At most Replicas-1 replicas are out of
// service at once (black-holed, paused or killed), so one always answers,
// which is what a client needs to make progress. A restart of the store
// never overlaps: it is a fault of every replica at once.
package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind string

const (
	// Blackhole drops every byte of one replica's link to the store,
	// silently (no RST), until the heal; the replica's connections hang.
	Blackhole Kind = "blackhole"
	// Reset closes every connection of one replica's link with a reset.
	Reset Kind = "reset"
	// Skew sets one replica's clock off by up to MaxSkew either way, and
	// back at the heal.
	Skew Kind = "skew"
	// Pause SIGSTOPs one replica for longer than its lease, then SIGCONTs it.
	Pause Kind = "pause"
	// Kill SIGKILLs one replica and starts it again at the heal.
	Kill Kind = "kill"
	// RestartStore restarts PostgreSQL (pg_ctl stop -m immediate, start).
	RestartStore Kind = "restart_store"
	// Slow delays one replica's link to the store (the campaign: 50 ms ±
	// 20 ms each way), and lifts the delay at the heal.
	Slow Kind = "slow"
)

// Fault is one episode of a schedule.
type Fault struct {
	At      time.Duration // from the start of the run
	Kind    Kind
	Replica int           // the replica or link it hits (none for RestartStore)
	Skew    time.Duration // for Skew: the offset
	Hold    time.Duration // how long it lasts before the heal
}

func (f Fault) String() string {
	s := fmt.Sprintf("%v %s replica=%d hold=%v", f.At.Round(time.Millisecond), f.Kind, f.Replica, f.Hold.Round(time.Millisecond))
	if f.Kind == Skew {
		s += fmt.Sprintf(" skew=%v", f.Skew)
	}
	return s
}

// Options shape a schedule.
type Options struct {
	Replicas int
	Kinds    []Kind // the faults to draw from: every one once per len(Kinds) faults
	// Hold is the mean time a fault lasts (uniform in [Hold/2, 3*Hold/2));
	// PauseHold, for Pause, must outlast the replica's lease.
	Hold, PauseHold time.Duration
	// Gap is the mean quiet time after a heal.
	Gap time.Duration
	// MaxSkew bounds a clock skew. Skews alternate in sign (the first
	// one's drawn); of each four, the first two are the full MaxSkew
	// (one each way) and the others uniform in [MaxSkew/10, MaxSkew], so
	// that a short run meets the bound.
	MaxSkew time.Duration
	// Overlap is the chance, in [0, 1], that a fault starts while the one
	// before it holds, on a replica no fault holds then.
	Overlap float64
}

// Schedule draws faults from the seed until the run's length, in order of
// their start.
func Schedule(seed uint64, length time.Duration, o Options) []Fault {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out []Fault
	around := func(d time.Duration) time.Duration {
		if d <= 0 {
			return 0
		}
		return d/2 + time.Duration(r.Int64N(int64(d)))
	}
	replicas := max(o.Replicas, 1)
	// end is when every fault drawn so far has healed.
	end := time.Duration(0)
	at := around(o.Gap)
	var cycle []int
	skews := 0
	negative := r.IntN(2) == 0
	for at < length && len(o.Kinds) > 0 {
		// Kinds come in cycles, each a seeded permutation of all of
		// them, so that a short run still meets every kind.
		if len(cycle) == 0 {
			cycle = r.Perm(len(o.Kinds))
		}
		kind := o.Kinds[cycle[0]]
		cycle = cycle[1:]
		f := Fault{At: at, Kind: kind, Replica: r.IntN(replicas), Hold: around(o.Hold)}
		// The overlap is drawn for every fault, used or not, so that
		// one choice does not shift every later draw.
		overlap := r.Float64() < o.Overlap
		pick := r.Uint64()
		if n := len(out); n > 0 && overlap && kind != RestartStore && out[n-1].Kind != RestartStore {
			prev := out[n-1]
			start := prev.At + prev.Hold/4 + time.Duration(pick%uint64(prev.Hold/2+1))
			if free := freeAt(out, start, replicas); len(free) > 0 && (!stops(kind) || stoppedAt(out, start)+1 < replicas) {
				f.At, f.Replica = start, free[int(pick>>32)%len(free)]
			}
		}
		switch f.Kind {
		case Pause:
			f.Hold = o.PauseHold + around(o.Hold)/4
		case Skew:
			tenth := o.MaxSkew / 10
			f.Skew = o.MaxSkew
			if skews%4 >= 2 {
				f.Skew = tenth + time.Duration(r.Int64N(int64(o.MaxSkew-tenth)+1))
			}
			if negative {
				f.Skew = -f.Skew
			}
			negative = !negative
			skews++
		}
		out = append(out, f)
		end = max(end, f.At+f.Hold)
		at = end + around(o.Gap)
	}
	return out
}

// stops says whether a fault takes its replica out of service: clients
// sent to it wait or fail until the heal.
func stops(k Kind) bool { return k == Blackhole || k == Pause || k == Kill }

// stoppedAt counts the replicas a fault that stops them holds at t.
func stoppedAt(faults []Fault, t time.Duration) int {
	n := 0
	for _, f := range faults {
		if f.At <= t && t < f.At+f.Hold && stops(f.Kind) {
			n++
		}
	}
	return n
}

// freeAt lists the replicas no fault in faults holds at t, in order; a
// store restart holds them all.
func freeAt(faults []Fault, t time.Duration, replicas int) []int {
	busy := map[int]bool{}
	for _, f := range faults {
		if f.At <= t && t < f.At+f.Hold {
			if f.Kind == RestartStore {
				return nil
			}
			busy[f.Replica] = true
		}
	}
	var free []int
	for i := range replicas {
		if !busy[i] {
			free = append(free, i)
		}
	}
	return free
}

// Actions carry out faults; a nil action for a kind in a schedule is an
// error at [Run]. Each gets the fault; its heal undoes it.
type Actions map[Kind]Action

// Action applies a fault and heals it.
type Action struct {
	Do, Heal func(Fault) error
}

// Run plays a schedule from now: each fault at its offset, healed after
// its hold; faults that overlap are applied and healed in the order of
// those times. It returns the number of faults injected per kind. On a
// cancelled ctx it heals the faults in progress and returns. The waits are
// timers, not sleeps for a result: the schedule is the one thing here
// that is about time.
func Run(ctx context.Context, faults []Fault, acts Actions, logf func(string, ...any)) (map[Kind]int, error) {
	for _, f := range faults {
		if a, ok := acts[f.Kind]; !ok || a.Do == nil || a.Heal == nil {
			return nil, fmt.Errorf("nemesis: no action for %s", f.Kind)
		}
	}
	type event struct {
		at   time.Duration
		heal bool
		i    int // the fault's index
	}
	var events []event
	for i, f := range faults {
		events = append(events, event{f.At, false, i}, event{f.At + f.Hold, true, i})
	}
	// At equal times a heal goes first: it frees what the next fault
	// may take.
	sort.SliceStable(events, func(i, j int) bool {
		if events[i].at != events[j].at {
			return events[i].at < events[j].at
		}
		return events[i].heal && !events[j].heal
	})
	start := time.Now()
	count := map[Kind]int{}
	active := map[int]bool{} // by index
	wait := func(until time.Duration) bool {
		t := time.NewTimer(time.Until(start.Add(until)))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	heal := func(i int) error {
		f := faults[i]
		delete(active, i)
		logf("nemesis: heal %s replica=%d", f.Kind, f.Replica)
		if err := acts[f.Kind].Heal(f); err != nil {
			return fmt.Errorf("nemesis: heal %s: %w", f, err)
		}
		return nil
	}
	for _, e := range events {
		if !e.heal && ctx.Err() != nil {
			break
		}
		if !wait(e.at) && !e.heal {
			break
		}
		if e.heal {
			if !active[e.i] {
				continue
			}
			if err := heal(e.i); err != nil {
				return count, err
			}
			continue
		}
		f := faults[e.i]
		logf("nemesis: %s", f)
		if err := acts[f.Kind].Do(f); err != nil {
			return count, fmt.Errorf("nemesis: %s: %w", f, err)
		}
		active[e.i] = true
		count[f.Kind]++
	}
	// Heals even when ctx ended: a cancelled run leaves no fault behind.
	var left []int
	for i := range active {
		left = append(left, i)
	}
	sort.Ints(left)
	for _, i := range left {
		if err := heal(i); err != nil {
			return count, err
		}
	}
	return count, nil
}

// EnvSeed names the variable that replays a seed.
const EnvSeed = "MCP_OUTBOX_JEPSEN_SEED"

// Seed returns the seed in EnvSeed, or a fresh one.
func Seed() (uint64, error) {
	if s := os.Getenv(EnvSeed); s != "" {
		return strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	}
	return rand.Uint64(), nil
}

// Summary formats counts per kind, in the order of kinds.
func Summary(count map[Kind]int, kinds []Kind) string {
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, "  %-14s %d\n", k, count[k])
	}
	return b.String()
}

// Overlapping counts the faults of faults that start while another holds.
func Overlapping(faults []Fault) int {
	n := 0
	for i, f := range faults {
		for _, g := range faults[:i] {
			if g.At <= f.At && f.At < g.At+g.Hold {
				n++
				break
			}
		}
	}
	return n
}
