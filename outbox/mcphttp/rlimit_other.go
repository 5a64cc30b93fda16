//go:build !unix

package mcphttp

// openFileLimit is 0: no limit known here.
func openFileLimit() int { return 0 }
