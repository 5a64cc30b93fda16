//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"strings"
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

// Inject performs the action configured for name, if any.
func Inject(name string) error {
	action, ok := actions[name]
	if !ok {
		return nil
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
