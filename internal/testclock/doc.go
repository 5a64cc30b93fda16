// Package testclock lets a fault campaign skew the wall clock of a whole
// serve process, as a machine whose clock is minutes off would have it.
//
// libfaketime (Debian's faketime, LD_PRELOAD) cannot do this for a Go
// program: checked here with libfaketime 0.9.10 and FAKETIME="+120s", a Go
// binary printed the true time, statically linked or built with cgo
// alike, because the Go runtime reads the clock through the vDSO (or a raw
// syscall) and never calls libc's clock_gettime, which is what libfaketime
// replaces. So the skew goes in through the layer's injected clock
// (outbox.Options.Now), which on SQLite decides leases and due times and on
// PostgreSQL is only the reference the database's clock is counted on
// from (see outbox/internal/dbclock).
//
// In a build with the tag "failpoints", MCP_OUTBOX_CLOCK_OFFSET_FILE names
// a file holding a Go duration ("2m", "-90s"); [Now] returns a clock that
// is time.Now plus that duration, and the file is read again every 100 ms,
// so a test can make the clock jump while the process runs. Without the
// tag [Now] returns nil (the layer's default clock) and the variable is
// ignored: production builds carry none of this.
package testclock

// EnvVar names the file holding the offset.
const EnvVar = "MCP_OUTBOX_CLOCK_OFFSET_FILE"
