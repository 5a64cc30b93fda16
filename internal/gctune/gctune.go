// Package gctune sets the garbage collector's target of this module's
// long-running servers.
//
// The go-sdk (v1.8.0) allocates about 490 KB for each tools/call it
// serves: its JSON decoding goes through a decoder that starts with a
// 32 KB buffer, about fifteen times per call (BenchmarkCharge/nothing-kept
// in package outbox shows 492,000 B/op, 381 allocs/op). Nearly all of it is
// garbage at once, while a server's live heap is a few megabytes, so with
// Go's default GOGC=100 the collector runs every few calls and takes about
// a third of the server's CPU time. Letting the heap grow to five times the
// live heap before a cycle cuts that to a fraction for a few tens of
// megabytes: measured from outside (`go run ./cmd/outbox-load --gogc N`),
// it raises the calls per second of serve and of a bare go-sdk server
// alike by about half.
//
// That headroom is a multiple of the live heap, and what is live grows
// with the requests in flight: a 4 MiB tools/call passes through the
// go-sdk's decoder several times over (about 110 MB allocated per call,
// BenchmarkLargeCall in outbox/mcphttp), and eight of them at once took
// serve to 470 MiB of peak RSS with GOGC=400 alone (issue 37). So the
// servers also run with a soft memory limit, DefaultMemoryLimit: below
// it the collector keeps GOGC's pace, near it the collector runs sooner,
// and the garbage of large bodies does not pile up. A live heap above the
// limit is not refused (the limit is soft): the collector runs more often,
// its CPU capped by the runtime at about half.
package gctune

import (
	"os"
	"runtime/debug"
)

// DefaultPercent is the GOGC the servers run with when the environment
// does not set one.
const DefaultPercent = 400

// DefaultMemoryLimit is the soft memory limit (debug.SetMemoryLimit) the
// servers run with when the environment sets no GOMEMLIMIT: serve idles
// at about 30 MiB of RSS and a live heap of a few megabytes, so the limit
// is reached only under large bodies, and keeps the peak RSS of sixteen
// concurrent 4 MiB calls of one token under 200 MiB (README, Limits).
const DefaultMemoryLimit = 128 << 20

// Apply sets the collector's target to DefaultPercent unless GOGC is set
// in the environment (which the runtime has then applied already, and
// which always wins), and the soft memory limit to DefaultMemoryLimit
// unless GOMEMLIMIT is set (likewise; GOMEMLIMIT=off removes it). It
// returns the percent in force and whether it came from the environment.
func Apply() (percent int, fromEnv bool) {
	if v, ok := os.LookupEnv("GOMEMLIMIT"); !ok || v == "" {
		debug.SetMemoryLimit(DefaultMemoryLimit)
	}
	if v, ok := os.LookupEnv("GOGC"); ok && v != "" {
		p := debug.SetGCPercent(-1) // read the value the runtime took from GOGC
		debug.SetGCPercent(p)
		return p, true
	}
	debug.SetGCPercent(DefaultPercent)
	return DefaultPercent, false
}
