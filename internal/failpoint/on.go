//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Enabled reports whether this binary was built with failpoints.
const Enabled = true

var actions = parse(os.Getenv(EnvVar))

func parse(spec string) map[string]string {
	m := map[string]string{}
	for _, part := range strings.Split(spec, ";") {
		name, action, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok {
			m[strings.TrimSpace(name)] = strings.TrimSpace(action)
		}
	}
	return m
}

// hits counts how often each point with an "@N" action was reached.
var (
	hitsMu sync.Mutex
	hits   = map[string]int{}
)

// Inject performs the action configured for name, if any.
func Inject(name string) error {
	action, ok := actions[name]
	if !ok {
		return nil
	}
	if a, nth, ok := strings.Cut(action, "@"); ok {
		// action@N acts on the N-th time the point is reached only, so
		// that a crash can land in the middle of a sequence of calls.
		n, err := strconv.Atoi(nth)
		if err != nil || n < 1 {
			return fmt.Errorf("failpoint %s: bad count in %q", name, action)
		}
		hitsMu.Lock()
		hits[name]++
		reached := hits[name]
		hitsMu.Unlock()
		if reached != n {
			return nil
		}
		action = a
	}
	switch {
	case action == "crash":
		fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is delivered asynchronously; never go on
	case action == "error":
		return fmt.Errorf("failpoint %s", name)
	case action == "panic":
		panic("failpoint " + name)
	case strings.HasPrefix(action, "sleep(") && strings.HasSuffix(action, ")"):
		d, err := time.ParseDuration(action[len("sleep(") : len(action)-1])
		if err != nil {
			return fmt.Errorf("failpoint %s: %w", name, err)
		}
		time.Sleep(d)
		return nil
	}
	return fmt.Errorf("failpoint %s: unknown action %q", name, action)
}
