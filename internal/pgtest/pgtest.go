// Package pgtest runs a throwaway PostgreSQL server for tests: a cluster made
// by initdb in a temporary directory, started by pg_ctl on a free port of
// 127.0.0.1, and removed when the tests end. Each test gets a database of
// its own on it ([Database]).
//
// MCP_OUTBOX_TEST_POSTGRES names a server to use instead (a URL whose user
// may create databases); tests then create and drop their databases there.
// Without it, the binaries are looked up in PATH, then in Debian's
// /usr/lib/postgresql/N/bin, which Debian keeps off the PATH. When neither
// works the tests that need PostgreSQL skip, unless
// MCP_OUTBOX_REQUIRE_POSTGRES=1 (make test sets it), which makes them fail.
//
// PostgreSQL refuses to run as root, so when the tests run as root the
// cluster belongs to the "postgres" user and its commands run through
// runuser.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	// Registers the "pgx" driver for the admin connection, and the
	// PostgreSQL store, so that schema.Open takes the URLs this package
	// gives.
	_ "github.com/mcp-outbox/mcp-outbox/schema/postgres"
)

// EnvURL names an existing server to use instead of starting one.
const EnvURL = "MCP_OUTBOX_TEST_POSTGRES"

// EnvRequire makes tests fail, not skip, when no server can be had.
const EnvRequire = "MCP_OUTBOX_REQUIRE_POSTGRES"

// Server is a PostgreSQL cluster of the tests' own.
type Server struct {
	// URL connects to the "postgres" database as the superuser.
	URL string
	// Port is the TCP port on 127.0.0.1.
	Port int

	dir     string // holds the data directory, the socket and the log
	bin     string // directory of initdb, pg_ctl
	asUser  string // run the commands as this user ("" = as ourselves)
	durable bool   // fsync on, as in production (benchmarks)
}

// Start creates a cluster in a new temporary directory and starts it, with
// fsync off (see start).
func Start() (*Server, error) { return startCluster(false) }

// StartDurable is Start with fsync and full-page writes on, PostgreSQL's
// defaults, for measurements that must pay what production pays.
func StartDurable() (*Server, error) { return startCluster(true) }

func startCluster(durable bool) (*Server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, durable: durable}
	if os.Geteuid() == 0 {
		s.asUser = "postgres"
	}
	s.dir, err = os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	if s.asUser != "" {
		u, err := user.Lookup(s.asUser)
		if err != nil {
			return nil, fmt.Errorf("pgtest: running as root needs the %s user: %w", s.asUser, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(s.dir, uid, gid); err != nil {
			return nil, err
		}
	}
	if out, err := s.run("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--no-locale", "--no-sync"); err != nil {
		os.RemoveAll(s.dir)
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	if err := s.start(); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// start starts the cluster, on a new free port the first time and on the
// same port after a stop.
func (s *Server) start() error {
	var lastErr error
	for try := 0; try < 5; try++ {
		if s.Port == 0 || try > 0 {
			p, err := freePort()
			if err != nil {
				return err
			}
			s.Port = p
		}
		// fsync is off for tests: they kill PostgreSQL's processes, never
		// the machine, and the operating system keeps what was written.
		sync := "-c fsync=off -c full_page_writes=off"
		if s.durable {
			sync = "-c fsync=on -c full_page_writes=on"
		}
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 %s "+
			"-c max_connections=300 -c shared_buffers=128MB", s.Port, s.dir, sync)
		out, err := s.run("pg_ctl", "-D", s.data(), "-l", filepath.Join(s.dir, "log"), "-o", opts, "-w", "-t", "60", "start")
		if err == nil {
			s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
			return nil
		}
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		lastErr = fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n%s", err, out, tail(string(log), 2000))
		if !strings.Contains(string(log), "already in use") && !strings.Contains(string(log), "could not bind") {
			return lastErr
		}
	}
	return lastErr
}

// Kill stops the server at once, as a crash would (pg_ctl stop -m
// immediate: no checkpoint, recovery at the next start). Connections see
// their server gone.
func (s *Server) Kill() error {
	if out, err := s.run("pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Restart starts a killed or stopped server again on the same port.
func (s *Server) Restart() error { return s.start() }

// Stop stops the server and removes its directory.
func (s *Server) Stop() error {
	_, err := s.run("pg_ctl", "-D", s.data(), "-m", "fast", "-w", "stop")
	return errors.Join(err, os.RemoveAll(s.dir))
}

func (s *Server) run(name string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, name)
	var cmd *exec.Cmd
	if s.asUser != "" {
		cmd = exec.Command("runuser", append([]string{"-u", s.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

// findBin finds the directory of initdb: in PATH, else the newest of
// Debian's /usr/lib/postgresql/N/bin.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	if len(dirs) > 0 {
		return filepath.Dir(dirs[0]), nil
	}
	return "", errors.New("pgtest: initdb not found in PATH or /usr/lib/postgresql/*/bin " +
		"(install PostgreSQL, or set " + EnvURL + " to a server's URL)")
}

func version(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// The server shared by the tests of one test binary.
var (
	shared struct {
		once sync.Once
		srv  *Server
		url  string
		err  error
	}
	databaseNo atomic.Int64
)

// Shared returns the URL of the tests' server ("postgres" database): the
// one EnvURL names, or one started on first use and stopped by [Main].
func Shared(tb testing.TB) string {
	tb.Helper()
	shared.once.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			shared.url = u
			return
		}
		shared.srv, shared.err = Start()
		if shared.err == nil {
			shared.url = shared.srv.URL
		}
	})
	if shared.err != nil {
		if os.Getenv(EnvRequire) != "" {
			tb.Fatalf("PostgreSQL is required (%s is set): %v", EnvRequire, shared.err)
		}
		tb.Skipf("no PostgreSQL: %v", shared.err)
	}
	return shared.url
}

// Main runs the tests and stops the shared server, if one was started.
// Packages that use [Database] call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

// StopShared stops the shared server, if one was started; a TestMain that
// does more than [Main] calls it after m.Run.
func StopShared() {
	if shared.srv != nil {
		if err := shared.srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop:", err)
		}
	}
}

// Database creates an empty database for the test on the shared server
// and returns its URL; it is dropped when the test ends.
func Database(tb testing.TB) string {
	tb.Helper()
	base := Shared(tb)
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), databaseNo.Add(1))
	admin, err := sql.Open("pgx", base)
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("pgtest: create database: %v", err)
	}
	tb.Cleanup(func() {
		admin, err := sql.Open("pgx", base)
		if err != nil {
			return
		}
		defer admin.Close()
		// WITH (FORCE) ends the connections a test left open (PostgreSQL 13+).
		_, _ = admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
	})
	return WithDatabase(base, name)
}

// WithDatabase is u with its database replaced by name.
func WithDatabase(u, name string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.Path = "/" + name
	return p.String()
}

// Required reports whether tests must fail, not skip, without PostgreSQL.
func Required() bool { return os.Getenv(EnvRequire) != "" }

// Available says why no cluster can be started here, or nil if one can.
func Available() error {
	_, err := findBin()
	return err
}

// CPU is the user and system time that the cluster's processes have spent
// so far: the postmaster, every process it runs now (backends, the WAL
// writer, the checkpointer, autovacuum), and those that have exited,
// which the kernel adds to the postmaster's children's time when it reaps
// them. Two readings around a load give the database's own work for it
// (Linux /proc).
func (s *Server) CPU() (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(s.data(), "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: read postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("pgtest: postmaster.pid: %w", err)
	}
	own, _, children, err := procCPU(pm)
	if err != nil {
		return 0, err
	}
	total := own + children
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pm {
			continue
		}
		cpu, parent, _, err := procCPU(pid)
		if err != nil || parent != pm {
			continue // gone meanwhile, or not the cluster's
		}
		total += cpu
	}
	return total, nil
}

// procCPU reads a process's own user+system time, its parent, and the
// time of its reaped children from /proc/PID/stat.
func procCPU(pid int) (own time.Duration, ppid int, children time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	s := string(b)
	// The command name, in parentheses, may hold spaces: count the fields
	// after it (state is the first, ppid the second, utime the 12th).
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("pgtest: /proc/%d/stat: too few fields", pid)
	}
	n := func(i int) time.Duration {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		return time.Duration(v) * time.Second / 100 // USER_HZ is 100 on Linux
	}
	ppid, _ = strconv.Atoi(f[1])
	return n(11) + n(12), ppid, n(13) + n(14), nil
}
