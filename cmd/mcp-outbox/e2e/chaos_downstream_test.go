package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
)

// The soak's downstream is the fake payments API of internal/downstream in
// a process of its own, so that the monkey can SIGKILL it. What it applied
// is in a journal file that outlives the process, as a real API's database
// would: started again on the same address and journal, it still knows
// every key and replays it rather than charging twice.
//
// The process is this test binary again: when chaosDownstreamEnv is set,
// init runs the downstream instead of the tests. That needs no build (the
// package's TestMain builds binaries before any test, which would cost
// every restart seconds) and nothing outside the test files.

// chaosDownstreamEnv holds the JSON of a chaosDownstreamConfig.
const chaosDownstreamEnv = "MCP_OUTBOX_CHAOS_DOWNSTREAM"

// chaosDownstreamReady is what the downstream prints on stdout, followed
// by its URL, once it listens.
const chaosDownstreamReady = "chaos downstream listening at "

func init() {
	if cfg, ok := os.LookupEnv(chaosDownstreamEnv); ok {
		os.Exit(runChaosDownstream(cfg, os.Stdout, os.Stderr))
	}
}

type chaosDownstreamConfig struct {
	Journal string
	Addr    string // "" for a free port: the first start
	// Seed and Incarnation seed the faults' RNG: each start draws another
	// sequence, and the same soak seed draws the same ones.
	Seed, Incarnation uint64
	Faults            chaosFaults
}

// chaosFaults are the probabilities of the faults the downstream injects
// into a request, each drawn independently per request.
type chaosFaults struct {
	Unavailable float64       // 503 before anything is applied
	Drop        float64       // applied, then the connection closes: the answer is lost
	Reset       float64       // TCP RST once the request is read; nothing applied
	Slow        float64       // applied, answered after SlowDelay (past the sender's timeout)
	SlowDelay   time.Duration //
}

// pick maps a uniform draw in [0, 1) to a fault; the zero Fault is none.
func (f chaosFaults) pick(r float64) downstream.Fault {
	for _, c := range []struct {
		p     float64
		fault func() downstream.Fault
	}{
		{f.Unavailable, func() downstream.Fault { return downstream.Status(http.StatusServiceUnavailable) }},
		{f.Drop, downstream.AcceptThenClose},
		{f.Reset, downstream.Reset},
		{f.Slow, func() downstream.Fault { return downstream.Slow(f.SlowDelay) }},
	} {
		if r < c.p {
			return c.fault()
		}
		r -= c.p
	}
	return downstream.Fault{}
}

// runChaosDownstream is the downstream process's main: it serves until
// SIGKILL (the monkey) or SIGTERM.
func runChaosDownstream(raw string, stdout, stderr io.Writer) int {
	var cfg chaosDownstreamConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(stderr, "chaos downstream: config: %v\n", err)
		return 2
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Incarnation))
	opts := &downstream.Options{
		Addr:    cfg.Addr,
		Journal: cfg.Journal,
		// Called under the server's lock: rng needs no lock of its own.
		FaultFunc: func(_, _, _ string) downstream.Fault { return cfg.Faults.pick(rng.Float64()) },
	}
	s, err := chaosListenAgain(opts, 10*time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "chaos downstream: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, chaosDownstreamReady+s.URL())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	if err := s.Close(); err != nil {
		fmt.Fprintf(stderr, "chaos downstream: %v\n", err)
		return 1
	}
	return 0
}

// chaosListenAgain starts the downstream, retrying while its address is still
// taken: the port of a killed process may briefly be held, or taken by
// another process's outgoing connection.
func chaosListenAgain(opts *downstream.Options, timeout time.Duration) (*downstream.Server, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s, err := downstream.New(opts)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return s, err
		}
		<-tick.C
	}
}

// chaosDownstream supervises the downstream process for the soak.
type chaosDownstream struct {
	log *chaosLog
	exe string

	mu  sync.Mutex
	cfg chaosDownstreamConfig
	p   *chaosProc
	url string
}

func newChaosDownstream(log *chaosLog, journal string, seed uint64, faults chaosFaults) (*chaosDownstream, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the test binary: %w", err)
	}
	d := &chaosDownstream{log: log, exe: exe, cfg: chaosDownstreamConfig{Journal: journal, Seed: seed, Faults: faults}}
	if err := d.start(); err != nil {
		return nil, err
	}
	return d, nil
}

// start starts a new incarnation on the address of the first, which every
// serve process was given as its destination.
func (d *chaosDownstream) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfg.Incarnation++
	cfg, _ := json.Marshal(d.cfg) // plain fields always marshal
	name := fmt.Sprintf("downstream#%d", d.cfg.Incarnation)
	cmd := exec.Command(d.exe)
	cmd.Env = append(os.Environ(), chaosDownstreamEnv+"="+string(cfg))
	out := newChaosLineWriter(d.log, name, chaosDownstreamReady)
	cmd.Stdout, cmd.Stderr = out, newChaosLineWriter(d.log, name, "")
	p, url, err := startChaosProc(cmd, out, 30*time.Second)
	if err != nil {
		return err
	}
	d.p, d.url = p, url
	if d.cfg.Addr == "" {
		d.cfg.Addr = strings.TrimPrefix(url, "http://")
	}
	return nil
}

// URL is the downstream's base URL, the same for every incarnation.
func (d *chaosDownstream) URL() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.url
}

// kill SIGKILLs the running incarnation and reports whether it died of it.
func (d *chaosDownstream) kill(ctx context.Context) (bool, error) {
	d.mu.Lock()
	p := d.p
	d.mu.Unlock()
	killed, err := p.kill(ctx)
	if killed {
		d.log.printf("[monkey] SIGKILL downstream (pid %d)", p.cmd.Process.Pid)
	}
	return killed, err
}
