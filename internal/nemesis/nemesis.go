// Package nemesis schedules faults over a set of replicas from a seed, the
// way Jepsen's nemesis does, so that a failing run reproduces: the same
// seed gives the same faults, on the same replicas, at the same offsets
// from the start (what the system does in between still varies with the
// machine's timing).
//
// A schedule is a sequence of episodes, one fault at a time: the fault,
// its hold, the heal, then a quiet gap in which the system can recover.
// One fault at a time keeps every finding attributable to one fault, and
// leaves a majority of replicas healthy throughout, which is what a client
// needs to make progress.
package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
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
	// MaxSkew bounds a clock skew (uniform in [-MaxSkew, MaxSkew], at
	// least a tenth of it away from zero).
	MaxSkew time.Duration
}

// Schedule draws faults from the seed until the run's length.
func Schedule(seed uint64, length time.Duration, o Options) []Fault {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out []Fault
	at := time.Duration(0)
	around := func(d time.Duration) time.Duration {
		if d <= 0 {
			return 0
		}
		return d/2 + time.Duration(r.Int64N(int64(d)))
	}
	at += around(o.Gap)
	var cycle []int
	for at < length && len(o.Kinds) > 0 {
		// Kinds come in cycles, each a seeded permutation of all of
		// them, so that a short run still meets every kind.
		if len(cycle) == 0 {
			cycle = r.Perm(len(o.Kinds))
		}
		kind := o.Kinds[cycle[0]]
		cycle = cycle[1:]
		f := Fault{At: at, Kind: kind, Replica: r.IntN(max(o.Replicas, 1)), Hold: around(o.Hold)}
		switch f.Kind {
		case Pause:
			f.Hold = o.PauseHold + around(o.Hold)/4
		case Skew:
			tenth := o.MaxSkew / 10
			f.Skew = tenth + time.Duration(r.Int64N(int64(o.MaxSkew-tenth)+1))
			if r.IntN(2) == 0 {
				f.Skew = -f.Skew
			}
		}
		out = append(out, f)
		at += f.Hold + around(o.Gap)
	}
	return out
}

// Actions carry out faults; a nil action for a kind in a schedule is an
// error at [Run]. Each gets the fault; its heal undoes it.
type Actions map[Kind]Action

// Action applies a fault and heals it.
type Action struct {
	Do, Heal func(Fault) error
}

// Run plays a schedule from now: each fault at its offset, healed after
// its hold. It returns the number of faults injected per kind. On a
// cancelled ctx it heals the fault in progress and returns. The waits are
// timers, not sleeps for a result: the schedule is the one thing here
// that is about time.
func Run(ctx context.Context, faults []Fault, acts Actions, logf func(string, ...any)) (map[Kind]int, error) {
	for _, f := range faults {
		if a, ok := acts[f.Kind]; !ok || a.Do == nil || a.Heal == nil {
			return nil, fmt.Errorf("nemesis: no action for %s", f.Kind)
		}
	}
	start := time.Now()
	count := map[Kind]int{}
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
	for _, f := range faults {
		if !wait(f.At) {
			break
		}
		a := acts[f.Kind]
		logf("nemesis: %s", f)
		if err := a.Do(f); err != nil {
			return count, fmt.Errorf("nemesis: %s: %w", f, err)
		}
		count[f.Kind]++
		wait(f.At + f.Hold) // heals even when ctx ends
		logf("nemesis: heal %s replica=%d", f.Kind, f.Replica)
		if err := a.Heal(f); err != nil {
			return count, fmt.Errorf("nemesis: heal %s: %w", f, err)
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
