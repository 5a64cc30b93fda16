// Package owner names the owners of claims and leases: a layer of package
// outbox and a dispatcher of package outbox/dispatch each hold claims, and
// each must tell its own, and a dead process's, from a live stranger's.
package owner

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Process names one layer in one process: host, pid, the process's start
// time (so that a reused pid is not mistaken for the old process) and a
// random nonce (so that two layers in one process are told apart).
//
// An owner string is a Process + "#" + attempt number.
type Process string

// Current names the calling process, with a fresh nonce.
func Current() Process {
	host, _ := os.Hostname()
	pid := os.Getpid()
	var n [4]byte
	_, _ = rand.Read(n[:])
	return Process(fmt.Sprintf("%s/%d/%s/%s", host, pid, startTime(pid), hex.EncodeToString(n[:])))
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

// Liveness is what can be known about the owner of a claim.
type Liveness int

const (
	Unknown Liveness = iota // another machine, or no /proc: trust the lease
	Dead                    // the owner's process is gone
	Self                    // an attempt of this very layer
)

// Of tells whether owner's process is known to be gone. It never
// claims a process is alive: a live process elsewhere is covered by the lease.
func (p Process) Of(owner string) Liveness {
	proc, _, _ := strings.Cut(owner, "#")
	if proc == string(p) {
		return Self
	}
	parts := strings.Split(proc, "/")
	mine := strings.Split(string(p), "/")
	if len(parts) != 4 || len(mine) != 4 || parts[0] != mine[0] || parts[2] == "" {
		return Unknown
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil {
		return Unknown
	}
	if st := startTime(pid); st != parts[2] {
		return Dead // no such process, or the pid now names another one
	}
	return Unknown
}
