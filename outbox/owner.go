package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// processID names one layer in one process: host, pid, the process's start
// time (so that a reused pid is not mistaken for the old process) and a
// random nonce (so that two layers in one process are told apart).
//
// An owner string is processID + "#" + attempt number.
type processID string

func currentProcess() processID {
	host, _ := os.Hostname()
	pid := os.Getpid()
	var n [4]byte
	_, _ = rand.Read(n[:])
	return processID(fmt.Sprintf("%s/%d/%s/%s", host, pid, startTime(pid), hex.EncodeToString(n[:])))
}

// startTime reads a process's start time in clock ticks since boot from
// /proc (Linux). It is "" where /proc is not available.
func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name (field 2) is in parentheses and may contain spaces:
	// count fields after the last ')'. starttime is field 22.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return ""
	}
	// A killed process that its parent has not reaped yet (a zombie, Z, or
	// dying, X) keeps its /proc entry and start time, but runs nothing.
	if fields[0] == "Z" || fields[0] == "X" {
		return ""
	}
	return fields[19]
}

// liveness is what can be known about the owner of a claim.
type liveness int

const (
	ownerUnknown liveness = iota // another machine, or no /proc: trust the lease
	ownerDead                    // the owner's process is gone
	ownerSelf                    // an attempt of this very layer
)

// ownerLiveness tells whether owner's process is known to be gone. It never
// claims a process is alive: a live process elsewhere is covered by the lease.
func (p processID) ownerLiveness(owner string) liveness {
	proc, _, _ := strings.Cut(owner, "#")
	if proc == string(p) {
		return ownerSelf
	}
	parts := strings.Split(proc, "/")
	mine := strings.Split(string(p), "/")
	if len(parts) != 4 || len(mine) != 4 || parts[0] != mine[0] || parts[2] == "" {
		return ownerUnknown
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil {
		return ownerUnknown
	}
	if st := startTime(pid); st != parts[2] {
		return ownerDead // no such process, or the pid now names another one
	}
	return ownerUnknown
}

// liveness is what the layer can know of owner. On SQLite every owner runs
// on this machine, so /proc tells a dead one. On PostgreSQL an owner may run
// on another machine, where /proc says nothing, and the same host name and
// pid may name another container's process: only this layer's own
// attempts are known, and every other owner is trusted until its lease
// passes. Live owners renew their leases (see renew.go).
func (l *Layer) liveness(owner string) liveness {
	if l.db.Dialect == schema.Postgres {
		if proc, _, _ := strings.Cut(owner, "#"); proc == string(l.self) {
			return ownerSelf
		}
		return ownerUnknown
	}
	return l.self.ownerLiveness(owner)
}
