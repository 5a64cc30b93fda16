package nemesis

import (
	"context"
	"reflect"
	"testing"
	"time"
)

func TestScheduleIsReproducible(t *testing.T) {
	o := Options{Replicas: 3, Kinds: []Kind{Blackhole, Reset, Skew, Pause, Kill, RestartStore}, Hold: time.Second, PauseHold: 3 * time.Second, Gap: time.Second, MaxSkew: 2 * time.Minute}
	a, b := Schedule(42, time.Minute, o), Schedule(42, time.Minute, o)
	if !reflect.DeepEqual(a, b) || len(a) < 5 {
		t.Fatalf("seed 42 gave %d then %d faults, or different ones", len(a), len(b))
	}
	if reflect.DeepEqual(a, Schedule(43, time.Minute, o)) {
		t.Fatal("seeds 42 and 43 gave the same schedule")
	}
	for i, f := range a {
		if i > 0 && f.At < a[i-1].At+a[i-1].Hold {
			t.Fatalf("fault %d (%s) starts before fault %d healed", i, f, i-1)
		}
		if f.Kind == Pause && f.Hold < o.PauseHold {
			t.Fatalf("%s: a pause shorter than the lease", f)
		}
		if f.Kind == Skew && (f.Skew == 0 || f.Skew > o.MaxSkew || f.Skew < -o.MaxSkew) {
			t.Fatalf("%s: skew out of bounds", f)
		}
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
