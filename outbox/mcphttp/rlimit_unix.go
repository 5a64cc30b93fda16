//go:build unix

package mcphttp

import "syscall"

// openFileLimit is the process's soft limit of open files, 0 if unknown.
func openFileLimit() int {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) != nil || r.Cur > 1<<30 {
		return 0
	}
	return int(r.Cur)
}
