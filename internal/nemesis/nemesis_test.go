package nemesis

import (
	"context"
	"reflect"
	"testing"
	"time"
)

var allKinds = []Kind{Blackhole, Reset, Slow, Skew, Pause, Kill, RestartStore}

func TestScheduleIsReproducible(t *testing.T) {
	o := Options{Replicas: 3, Kinds: allKinds, Hold: time.Second, PauseHold: 3 * time.Second, Gap: time.Second, MaxSkew: 2 * time.Minute, Overlap: 0.5}
	a, b := Schedule(42, time.Minute, o), Schedule(42, time.Minute, o)
	if !reflect.DeepEqual(a, b) || len(a) < 5 {
		t.Fatalf("seed 42 gave %d then %d faults, or different ones", len(a), len(b))
	}
	if reflect.DeepEqual(a, Schedule(43, time.Minute, o)) {
		t.Fatal("seeds 42 and 43 gave the same schedule")
	}
}

// Overlapping faults: some faults start while another holds, never on a
// replica another fault holds, never with every replica out of service,
// never across a store restart; every kind is drawn in the first cycle,
// and skews reach the bound both ways.
func TestScheduleOverlaps(t *testing.T) {
	for _, replicas := range []int{2, 3} {
		o := Options{Replicas: replicas, Kinds: allKinds, Hold: 2 * time.Second, PauseHold: 4 * time.Second, Gap: 1500 * time.Millisecond, MaxSkew: 2 * time.Minute, Overlap: 0.4}
		overlaps := 0
		for seed := range uint64(50) {
			fs := Schedule(seed, 10*time.Minute, o)
			first := map[Kind]bool{}
			for _, f := range fs[:len(allKinds)] {
				first[f.Kind] = true
			}
			if len(first) != len(allKinds) {
				t.Fatalf("seed %d: the first %d faults draw only %v", seed, len(allKinds), first)
			}
			skews := map[time.Duration]bool{}
			for i, f := range fs {
				if i > 0 && f.At <= fs[i-1].At {
					t.Fatalf("seed %d: fault %d (%s) starts no later than the one before", seed, i, f)
				}
				if f.Kind == Pause && f.Hold < o.PauseHold {
					t.Fatalf("%s: a pause shorter than the lease", f)
				}
				if f.Kind == Skew {
					if f.Skew == 0 || f.Skew > o.MaxSkew || f.Skew < -o.MaxSkew {
						t.Fatalf("%s: skew out of bounds", f)
					}
					skews[f.Skew] = true
				}
				stopped := 0
				for j, g := range fs[:i] {
					if g.At+g.Hold <= f.At {
						continue
					}
					if j == i-1 {
						overlaps++
					}
					if f.Kind == RestartStore || g.Kind == RestartStore {
						t.Fatalf("seed %d: %s overlaps %s", seed, f, g)
					}
					if g.Replica == f.Replica {
						t.Fatalf("seed %d: %s on a replica %s holds", seed, f, g)
					}
					if stops(g.Kind) {
						stopped++
					}
				}
				if stops(f.Kind) && stopped+1 >= replicas {
					t.Fatalf("seed %d: %s leaves no replica in service", seed, f)
				}
			}
			if !skews[o.MaxSkew] || !skews[-o.MaxSkew] {
				t.Fatalf("seed %d: skews %v never reach ±%v", seed, skews, o.MaxSkew)
			}
		}
		if overlaps == 0 {
			t.Fatalf("%d replicas: no fault ever overlapped another", replicas)
		}
		t.Logf("%d replicas: %d overlaps in 50 schedules", replicas, overlaps)
	}
}

func TestRunHealsEveryFault(t *testing.T) {
	faults := []Fault{{At: 0, Kind: Reset, Hold: time.Millisecond}, {At: 2 * time.Millisecond, Kind: Blackhole, Replica: 1, Hold: time.Millisecond}}
	var log []string
	act := func(what string) func(Fault) error {
		return func(f Fault) error { log = append(log, what+string(f.Kind)); return nil }
	}
	count, err := Run(context.Background(), faults, Actions{Reset: {act("do "), act("heal ")}, Blackhole: {act("do "), act("heal ")}}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"do reset", "heal reset", "do blackhole", "heal blackhole"}
	if !reflect.DeepEqual(log, want) || count[Reset] != 1 || count[Blackhole] != 1 {
		t.Fatalf("log %v counts %v, want %v", log, count, want)
	}
	if _, err := Run(context.Background(), []Fault{{Kind: Kill}}, Actions{}, t.Logf); err == nil {
		t.Fatal("a schedule with a fault and no action ran")
	}
}

// Overlapping faults are applied and healed in the order of their times,
// and a cancelled run heals the ones in progress.
func TestRunOverlapping(t *testing.T) {
	faults := []Fault{
		{At: 0, Kind: Pause, Replica: 0, Hold: 40 * time.Millisecond},
		{At: 10 * time.Millisecond, Kind: Slow, Replica: 1, Hold: 10 * time.Millisecond},
		{At: 30 * time.Millisecond, Kind: Skew, Replica: 2, Hold: time.Hour},
	}
	var log []string
	act := func(what string) func(Fault) error {
		return func(f Fault) error { log = append(log, what+string(f.Kind)); return nil }
	}
	a := Action{act("do "), act("heal ")}
	ctx, cancel := context.WithCancel(context.Background())
	acts := Actions{Pause: a, Slow: a, Skew: {Do: func(f Fault) error { log = append(log, "do skew"); cancel(); return nil }, Heal: act("heal ")}}
	count, err := Run(ctx, faults, acts, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"do pause", "do slow", "heal slow", "do skew", "heal pause", "heal skew"}
	if !reflect.DeepEqual(log, want) || count[Pause] != 1 || count[Slow] != 1 || count[Skew] != 1 {
		t.Fatalf("log %v counts %v, want %v", log, count, want)
	}
}
