package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/netfault"
	"github.com/mcp-outbox/mcp-outbox/internal/profenv"
)

// runSide starts the side's servers, loads them for the warm-up and the
// measured time, and adds the figures to res.
//
// With profile set, each server writes its profiles under that prefix.
func runSide(ctx context.Context, cfg config, st *store, c cell, s side, res *result, profile string) error {
	db, dbName := "", ""
	var proxy *netfault.Proxy
	if s.needsDB {
		var err error
		if db, dbName, err = st.fresh(ctx); err != nil {
			return err
		}
		if st.pg != nil && c.rtt >= 0 {
			// Every server reaches PostgreSQL through the proxy, at 0 RTT
			// too, so that its round trips are counted in every cell.
			if proxy, err = netfault.Start(fmt.Sprintf("127.0.0.1:%d", st.pg.Port)); err != nil {
				return err
			}
			proxy.SetDelay(c.rtt/2, 0)
			defer proxy.Close()
			db = viaProxy(db, proxy.Addr())
		}
	}
	var (
		procs   []*exec.Cmd
		metrics []string
		cl      *caller
		err     error
	)
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		if cl != nil {
			cl.close() // a stdio server exits when its stdin closes
		}
		for _, p := range procs {
			if c.transport != stdio {
				_ = p.Process.Signal(os.Interrupt)
				_ = p.Wait()
			}
		}
	}
	defer stop()
	if c.transport == stdio {
		cmd := withProfile(withGOGC(s.command(db, ""), cfg.gogc), profile)
		cmd.Stderr = io.Discard
		if cl, err = connectStdio(ctx, cmd, c); err != nil {
			return err
		}
		procs = append(procs, cmd)
	} else {
		var urls []string
		for n := range s.replicas {
			prof := profile
			if prof != "" && s.replicas > 1 {
				prof = fmt.Sprintf("%s-%d", profile, n+1)
			}
			cmd := withProfile(withGOGC(s.command(db, "127.0.0.1:0"), cfg.gogc), prof)
			u, err := startServer(cmd)
			if err != nil {
				return err
			}
			procs = append(procs, cmd)
			urls = append(urls, u)
			metrics = append(metrics, strings.TrimSuffix(u, "/mcp")+"/metrics")
		}
		if cl, err = connectHTTP(ctx, urls, c); err != nil {
			return err
		}
	}
	warm, _, _, err := load(ctx, cl, c.keyed, c.replay, cfg.warmup)
	if err != nil {
		return err
	}
	var rt0 int64
	if proxy != nil {
		rt0 = proxy.RoundTrips()
	}
	cpu0, self0 := cpuOf(procs), selfCPU()
	db0, dbErr := st.cpu(s)
	m0, mok0 := mallocsOf(ctx, metrics)
	start := time.Now()
	calls, errs, lat, err := load(ctx, cl, c.keyed, c.replay, cfg.duration)
	if err != nil {
		return err
	}
	res.elapsed += time.Since(start)
	res.cpu += cpuOf(procs) - cpu0
	if db1, err := st.cpu(s); dbErr == nil && err == nil {
		res.dbCPU += db1 - db0
		res.dbCPUKnown = true
	}
	res.loadCPU += selfCPU() - self0
	m1, mok1 := mallocsOf(ctx, metrics)
	if mok0 && mok1 {
		res.mallocs += m1 - m0
		res.mallocsKnown = true
	}
	if proxy != nil {
		res.roundTrips += proxy.RoundTrips() - rt0
		res.roundTripsKnown = true
	}
	res.peakRSS = max(res.peakRSS, peakRSSOf(procs))
	if st.pg != nil && dbName != "" {
		// pg_stat_database is written by each backend at most once a
		// second, and at its exit: read it once the servers are gone, and
		// count the warm-up's calls with the measured ones.
		stop()
		n, err := st.commits(ctx, dbName)
		if err != nil {
			return err
		}
		res.commits += n
		res.commitCalls += warm + calls
	}
	res.calls += calls
	res.errors += errs
	res.latencies = append(res.latencies, lat...)
	return nil
}

// startServer starts cmd and returns the /mcp URL it prints on stderr.
func startServer(cmd *exec.Cmd) (string, error) {
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if _, u, ok := strings.Cut(sc.Text(), "serving MCP at "); ok {
				urls <- u
			}
		}
	}()
	select {
	case u := <-urls:
		return u, nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return "", fmt.Errorf("%s did not report its address", filepath.Base(cmd.Path))
	}
}

// withGOGC sets GOGC for cmd when gogc is given; otherwise cmd inherits
// this process's environment without GOGC, so that each server picks its
// own default.
func withGOGC(cmd *exec.Cmd, gogc string) *exec.Cmd {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOGC=") })
	// Every load client connects from 127.0.0.1, as behind a reverse
	// proxy: the per-client connection bound would refuse the busier
	// levels (128 clients hold a connection each, and a session's stream).
	env = append(env, "MCP_OUTBOX_MAX_CONNS_PER_CLIENT=-1")
	if gogc != "" {
		env = append(env, "GOGC="+gogc)
	}
	cmd.Env = env
	return cmd
}

// withProfile has cmd write its profiles under prefix, if one is given.
func withProfile(cmd *exec.Cmd, prefix string) *exec.Cmd {
	if prefix != "" {
		cmd.Env = append(cmd.Env, profenv.Var+"="+prefix)
	}
	return cmd
}

// writeKeyFile writes a key file of one fresh key into dir.
func writeKeyFile(dir string) (string, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "keys")
	return path, os.WriteFile(path, []byte("load:"+base64.StdEncoding.EncodeToString(k)+"\n"), 0o600)
}
