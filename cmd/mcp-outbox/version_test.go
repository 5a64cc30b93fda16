package main

import (
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
)

func TestDescribeBuild(t *testing.T) {
	t.Run("Checkout", func(t *testing.T) {
		bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/mcp-outbox/mcp-outbox", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
				{Key: "vcs.time", Value: "2026-12-04T19:00:00Z"}, {Key: "vcs.modified", Value: "true"},
				{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"}}}
		got := describeBuild(bi)
		for _, want := range []string{
			"mcp-outbox (devel)\n",
			"module   github.com/mcp-outbox/mcp-outbox\n",
			"revision 0123456789abcdef0123456789abcdef01234567+modified (2026-12-04T19:00:00Z)\n",
			"go       go1.26.0 linux/amd64\n",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("describeBuild = %q, want it to contain %q", got, want)
			}
		}
	})
	t.Run("GoInstallOfATag", func(t *testing.T) {
		bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/mcp-outbox/mcp-outbox", Version: "v0.1.0", Sum: "h1:x"}}
		got := describeBuild(bi)
		if !strings.HasPrefix(got, "mcp-outbox v0.1.0\n") {
			t.Errorf("describeBuild = %q, want it to start with the tag", got)
		}
		if strings.Contains(got, "revision") {
			t.Errorf("describeBuild = %q names a revision the build has none of", got)
		}
	})
}

// TestVersionCommand runs the built binary: a build from this checkout
// names the commit it was built from.
func TestVersionCommand(t *testing.T) {
	if bin == "" {
		t.Skip("no test binary (fuzz-only run)")
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("mcp-outbox version: %v", err)
	}
	if !strings.HasPrefix(string(out), "mcp-outbox ") || !strings.Contains(string(out), "module   github.com/mcp-outbox/mcp-outbox\n") {
		t.Fatalf("mcp-outbox version printed %q", out)
	}
	if r := runCLI(t, nil, "version", "extra"); r.code != 2 {
		t.Errorf("version extra: exit %d, want 2 (a usage error)", r.code)
	}
	// The go command stamps the revision only when it may read the VCS:
	// -buildvcs=false (a common GOFLAGS in sandboxes) builds without it.
	if strings.Contains(os.Getenv("GOFLAGS"), "-buildvcs=false") {
		t.Skip("GOFLAGS has -buildvcs=false: the binary carries no revision to compare")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout (%v): no revision to compare", err)
	}
	if want := "revision " + strings.TrimSpace(string(head)); !strings.Contains(string(out), want) {
		t.Errorf("mcp-outbox version printed %q, want %q", out, want)
	}
}
