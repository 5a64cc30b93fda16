package main

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// transport is how the load reaches a server.
type transport string

const (
	// Streamable HTTP, 2026-07-28: every request stands alone, served by
	// the go-sdk's stateless handler (mcphttp routes it there).
	httpStateless transport = "http stateless"
	// Streamable HTTP, 2025-11-25: the client keeps a session.
	httpStateful transport = "http session"
	// stdio: one server process, its client's calls concurrent on the one
	// pipe, as a desktop client that starts the server drives it.
	stdio transport = "stdio"
)

// cell is one measured situation: how the load arrives and how much of it.
// Every side of the plan is measured in every cell, round after round.
type cell struct {
	transport transport
	keyed     bool // a fresh _meta.idempotencyKey per call, or none
	clients   int  // concurrent callers (HTTP: each its own client; stdio: calls in flight on one pipe)
	// rtt is the round-trip time between each server and PostgreSQL
	// through the delaying proxy; -1: no proxy (SQLite, or --rtt not given).
	rtt time.Duration
	// replay: each caller cycles through replayKeys keys of its own, so
	// that after the warm-up every measured call is a replay (--replay).
	replay bool
}

func (c cell) String() string {
	key := "keyed"
	if !c.keyed {
		key = "keyless"
	}
	if c.replay {
		key = "replays"
	}
	if c.rtt >= 0 {
		return fmt.Sprintf("%s, %s, %d clients, %v RTT to PostgreSQL", c.transport, key, c.clients, c.rtt)
	}
	return fmt.Sprintf("%s, %s, %d clients", c.transport, key, c.clients)
}

// side is one way of serving the charges. command returns the server's
// process: addr is "" for stdio.
type side struct {
	name     string
	short    string // the column header of the summary
	replicas int
	role     role
	command  func(db, addr string) *exec.Cmd
	needsDB  bool
}

// role says what a side is to the comparison.
type role int

const (
	roleLimit   role = iota // nothing kept: what the go-sdk and the tool cost
	roleCareful             // the best a careful user writes without the layer
	roleLayer
	roleExpert // the best an expert writes by hand for the store, without the layer
)

// plan lists the cells of a run: the HTTP stateless keyed load at every
// concurrency level (the headline), and at the level nearest 32 the other
// ways a load arrives.
func plan(levels []int, store string, quick, replay bool, rtts []time.Duration) []cell {
	var cells []cell
	if len(rtts) > 0 {
		for _, rtt := range rtts {
			for _, n := range levels {
				cells = append(cells, cell{transport: httpStateless, keyed: true, clients: n, rtt: rtt})
			}
		}
		return cells
	}
	for _, n := range levels {
		cells = append(cells, cell{transport: httpStateless, keyed: true, clients: n, rtt: -1})
	}
	if replay {
		for _, n := range levels {
			cells = append(cells, cell{transport: httpStateless, keyed: true, replay: true, clients: n, rtt: -1})
		}
	}
	if quick || store == "postgres" {
		return cells
	}
	mid := levels[0]
	for _, n := range levels {
		if abs(n-32) < abs(mid-32) {
			mid = n
		}
	}
	cells = append(cells,
		cell{transport: httpStateful, keyed: true, clients: mid, rtt: -1},
		cell{transport: httpStateless, keyed: false, clients: mid, rtt: -1},
		cell{transport: stdio, keyed: true, clients: 1, rtt: -1},
		cell{transport: stdio, keyed: true, clients: mid, rtt: -1},
	)
	return slices.CompactFunc(cells, func(a, b cell) bool { return a == b })
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// parseLevels reads "1,8,32,128".
func parseLevels(s string) ([]int, error) {
	var levels []int
	for f := range strings.SplitSeq(s, ",") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d", &n); err != nil || n < 1 {
			return nil, fmt.Errorf("--clients: %q is not a positive number", f)
		}
		levels = append(levels, n)
	}
	return levels, nil
}
