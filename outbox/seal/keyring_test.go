package seal_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/gcm"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
)

// hex64 is what 'openssl rand -hex 32' prints for a key whose base64 is
// then taken: 48 bytes, not 32.
const hex64 = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"

func key(t *testing.T) string {
	t.Helper()
	k := make([]byte, seal.KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(k)
}

// TestParseKeys: bad lines are refused with their line number; comments and
// blank lines are skipped; the first key is current.
func TestParseKeys(t *testing.T) {
	t.Parallel()
	good := key(t)
	for _, c := range []struct{ in, want string }{
		{"", "no key"},
		{"# only a comment\n\n", "no key"},
		{"k1\n", "line 1: want ID:BASE64"},
		{"\nk1:" + good + "\nk2:!!!\n", "line 3 (key \"k2\"): not base64"},
		{"k1:" + base64.StdEncoding.EncodeToString([]byte("short")), "line 1 (key \"k1\"): 5 bytes, want 32"},
		{"k1:" + good + "\nk1:" + good, "line 2: key id \"k1\" given twice"},
		{":" + good, "line 1: want ID"},
		{"k1:" + hex64, "line 1 (key \"k1\"): 48 bytes, want 32; make a key with 'openssl rand -base64 32'"},
		{"k\u200b1:" + good, "line 1: key id \"k\\u200b1\" has an invisible character (U+200B)"},
	} {
		if _, err := seal.ParseKeys([]byte(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseKeys(%q): %v, want an error with %q", c.in, err, c.want)
		}
	}
	// A Windows editor's byte order mark and line ends: the ids are what
	// they look like, so that the same key written without them (the next
	// key file) is the same key.
	bom, err := seal.ParseKeys([]byte("\ufeffk1:" + good + "\r\nk2:" + key(t) + "\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := bom.IDs(); len(got) != 2 || got[0] != "k1" || got[1] != "k2" {
		t.Errorf("ids of a file with a BOM and CRLF: %q, want k1, k2", got)
	}
	r, err := seal.ParseKeys([]byte("# keys\nnew:" + good + "\n\nold:" + key(t) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Current() != "new" || !r.Has("old") || r.Has("other") {
		t.Errorf("current %q, ids %v", r.Current(), r.IDs())
	}
	w, err := r.Wrap(context.Background(), "old", []byte("data key"), []byte("ad"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Unwrap(context.Background(), "new", w, []byte("ad")); !errors.Is(err, gcm.ErrTampered) {
		t.Errorf("unwrap under another key: %v, want ErrTampered", err)
	}
	if _, err := r.Unwrap(context.Background(), "old", w, []byte("other ad")); !errors.Is(err, gcm.ErrTampered) {
		t.Errorf("unwrap with other associated data: %v, want ErrTampered", err)
	}
	var missing *seal.MissingKeyError
	if _, err := r.Unwrap(context.Background(), "gone", w, []byte("ad")); !errors.As(err, &missing) || missing.KeyID != "gone" {
		t.Errorf("unwrap under a missing key: %v", err)
	}
}

// TestLoadKeyFile refuses a key file others than its owner may read, as
// ssh refuses a private key, but a root-owned one its group reads (a
// mounted Kubernetes secret).
func TestLoadKeyFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("k1:"+key(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(mode os.FileMode) error {
		t.Helper()
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := seal.LoadKeyFile(path)
		return err
	}
	refused := func(mode os.FileMode, why string) {
		t.Helper()
		err := load(mode)
		if err == nil || !strings.Contains(err.Error(), "chmod 600") || !strings.Contains(err.Error(), mode.String()) {
			t.Errorf("%s key file (%v): %v, want refused naming the mode and chmod 600", why, mode, err)
		}
	}
	refused(0o644, "world-readable")
	refused(0o604, "world-readable")
	refused(0o660, "group-writable")
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if err := load(mode); err != nil {
			t.Errorf("mode %v: %v", mode, err)
		}
	}
	if os.Getuid() != 0 {
		refused(0o640, "group-readable")
		refused(0o440, "group-readable")
	} else {
		for _, mode := range []os.FileMode{0o640, 0o440} {
			if err := load(mode); err != nil {
				t.Errorf("root-owned, mode %v: %v", mode, err)
			}
		}
		// Root may give the file away, and then its group must not read it.
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused(0o640, "group-readable, not root's")
	}
	if _, err := seal.LoadKeyFile(path + ".missing"); err == nil {
		t.Error("missing key file loaded")
	}
}
