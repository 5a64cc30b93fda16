//go:build failpoints

package testclock

import (
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var (
	once   sync.Once
	offset atomic.Int64
)

// Now returns a clock offset by the duration in the file EnvVar names, or
// nil when the variable is not set.
func Now() func() time.Time {
	path := os.Getenv(EnvVar)
	if path == "" {
		return nil
	}
	once.Do(func() {
		read(path)
		go func() {
			// The process lives as long as its clock: no stop needed.
			for range time.Tick(100 * time.Millisecond) {
				read(path)
			}
		}()
	})
	return func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
}

func read(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if d, err := time.ParseDuration(strings.TrimSpace(string(b))); err == nil {
		offset.Store(int64(d))
	}
}
