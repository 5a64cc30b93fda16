package postgres_test

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// startPgBouncer starts a PgBouncer in pool_mode mode in front of the
// server of database URL server, and returns the URL of that database
// through it. It skips the test where no pgbouncer is installed
// (Debian: apt-get install pgbouncer). PgBouncer refuses to run as root,
// so as root it runs as the postgres user, as pgtest's cluster does. It
// is stopped when the test ends.
func startPgBouncer(t *testing.T, server, mode string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			if os.Getenv("MCP_OUTBOX_REQUIRE_POSTGRES") == "1" {
				// CI installs it (.ci/run): a skip there would hide the
				// only test of the layer behind a pooler.
				t.Fatal("no pgbouncer installed, and MCP_OUTBOX_REQUIRE_POSTGRES=1 (apt-get install pgbouncer)")
			}
			t.Skip("no pgbouncer installed")
		}
	}
	su, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if os.Geteuid() == 0 {
		// As the user itself, not through runuser: killing runuser
		// leaves its child running.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = 20
logfile = %s
`, su.Hostname(), su.Port(), port, filepath.Join(dir, "users.txt"), mode, filepath.Join(dir, "log"))
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Fatalf("pgbouncer does not listen after 10s: %v\n%s", err, log)
		}
		time.Sleep(10 * time.Millisecond) // polls a condition, not a result
	}
	through := *su
	through.Host = fmt.Sprintf("127.0.0.1:%d", port)
	return through.String()
}
