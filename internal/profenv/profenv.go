// Package profenv lets a server process profile itself for the load
// tool: with MCP_OUTBOX_PROFILE=PREFIX in its environment, a process that
// calls Start writes PREFIX.cpu.pprof (CPU, from Start to the stop) and
// PREFIX.allocs.pprof (the allocations made meanwhile, sampled as the
// runtime samples them) when the returned stop runs.
//
// It is read from the environment rather than a flag so that a binary
// measured as "before" a change needs no flag it may not know, and it
// opens no endpoint: a server never serves its profile to the network.
package profenv

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// Var names the environment variable Start reads.
const Var = "MCP_OUTBOX_PROFILE"

// Start starts the CPU profile when Var is set, and returns the function
// that writes both profiles; it returns a no-op otherwise. A profile that
// cannot be written is reported on stderr, never fatal: it is a
// measurement aid.
func Start() (stop func()) {
	prefix := os.Getenv(Var)
	if prefix == "" {
		return func() {}
	}
	cpu, err := os.Create(prefix + ".cpu.pprof")
	if err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		cpu.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		cpu.Close()
		runtime.GC() // the allocations profile counts as of the last cycle
		f, err := os.Create(prefix + ".allocs.pprof")
		if err == nil {
			err = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
		}
	}
}
