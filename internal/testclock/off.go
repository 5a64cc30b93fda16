//go:build !failpoints

package testclock

import "time"

// Now returns nil: the layer's own clock.
func Now() func() time.Time { return nil }
