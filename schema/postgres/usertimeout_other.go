//go:build !linux

package postgres

import (
	"syscall"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT is Linux's alone;
// keepalive still bounds a silent peer.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }
