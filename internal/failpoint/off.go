//go:build !failpoints

package failpoint

// Enabled reports whether this binary was built with failpoints.
const Enabled = false

// Inject does nothing in a build without the failpoints tag.
func Inject(string) error { return nil }
