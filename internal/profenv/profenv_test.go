package profenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestMain lets the test binary act as a server that profiles itself, in
// a fresh process whose environment the test controls.
func TestMain(m *testing.M) {
	if os.Getenv("PROFENV_CHILD") == "1" {
		stop := Start()
		var kept [][]byte
		for i := range 100_000 {
			kept = append(kept[:0], make([]byte, i%512)) // something to sample
		}
		_ = kept
		stop()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestStart(t *testing.T) {
	t.Run("WritesBothProfiles", func(t *testing.T) {
		dir := t.TempDir()
		prefix := filepath.Join(dir, "server")
		child(t, dir, Var+"="+prefix)
		for _, name := range []string{prefix + ".cpu.pprof", prefix + ".allocs.pprof"} {
			b, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			// A profile is a gzipped protocol buffer.
			if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
				t.Errorf("%s: %d bytes, not a gzipped profile", name, len(b))
			}
		}
	})
	t.Run("NothingWithoutVar", func(t *testing.T) {
		dir := t.TempDir()
		child(t, dir, Var+"=")
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Fatalf("files written: %v", entries)
		}
	})
}

// child runs the test binary as a profiled process in dir.
func child(t *testing.T, dir, env string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PROFENV_CHILD=1", env)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
