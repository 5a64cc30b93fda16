package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// amplifyCommand measures what one ordinary token can make serve spend
// (issue 37): memory for concurrent large calls, CPU for a deeply nested one.
const amplifyCommand = "amplify"

const amplifyUsage = `Usage: outbox-load amplify [--mcp-outbox BIN] [--runs 3] [--calls 16] [--size 4MiB] [--nested-size 1MB] [--depth 990]

Measures from outside what one bearer token can make mcp-outbox serve
spend: serve --http runs as a process of its own (SQLite file, --tokens
with one principal), this process is the load. Each run starts a fresh
serve and reports

  memory   the peak RSS (VmHWM of /proc/PID/status) of serve before the
           load, and after --calls concurrent tools/call requests of
           --size bytes each (the padding in params._meta), all with the
           one token, stateless 2026-07-28
  cpu      serve's CPU time (utime+stime of /proc/PID/stat) for one
           tools/call whose arguments hold --nested-size bytes nested
           --depth deep (arrays, each with its share of the padding as
           small numbers), and for one with the same numbers in one flat
           array; each on a fresh serve

and the HTTP statuses the requests got (a refusal is a measurement too).

Flags:
`

type amplifyConfig struct {
	binary     string
	runs       int
	calls      int
	size       int
	nestedSize int
	depth      int
	serveArgs  []string
}

func runAmplify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("outbox-load amplify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), amplifyUsage)
		fs.PrintDefaults()
	}
	var cfg amplifyConfig
	fs.StringVar(&cfg.binary, "mcp-outbox", "", "the mcp-outbox binary (default: go build ./cmd/mcp-outbox)")
	fs.IntVar(&cfg.runs, "runs", 3, "runs of each measurement, each on a fresh serve")
	fs.IntVar(&cfg.calls, "calls", 16, "concurrent large calls of the memory measurement")
	fs.IntVar(&cfg.size, "size", 4<<20-4096, "bytes of each large call's body (the default stays under the 4 MiB body limit)")
	fs.IntVar(&cfg.nestedSize, "nested-size", 1_000_000, "bytes of padding of the nested and the flat call")
	fs.IntVar(&cfg.depth, "depth", 990, "nesting depth of the nested call's body, the message's own levels included")
	serveArgs := fs.String("serve-args", "", "extra flags for serve, space-separated (e.g. \"--max-in-flight-per-principal 16\")")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg.serveArgs = strings.Fields(*serveArgs)
	if cfg.runs < 1 || cfg.calls < 1 || cfg.size < 1024 || cfg.depth < 4 {
		fmt.Fprintln(stderr, "outbox-load amplify: --runs and --calls must be positive, --size at least 1024, --depth at least 4")
		return 2
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "outbox-load: "+format+"\n", a...) }
	dir, err := os.MkdirTemp("", "outbox-amplify-")
	if err != nil {
		logf("%v", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if cfg.binary, err = buildOrGiven(ctx, cfg.binary, dir, logf, stderr); err != nil {
		logf("%v", err)
		return 1
	}
	token, tokens, err := amplifyToken(ctx, cfg.binary, dir)
	if err != nil {
		logf("%v", err)
		return 1
	}
	fmt.Fprintf(stdout, "mcp-outbox serve --http, SQLite, one bearer token; %d concurrent calls of %d bytes; nested: %d bytes %d deep\n",
		cfg.calls, cfg.size, cfg.nestedSize, cfg.depth)
	fmt.Fprintf(stdout, "%-4s %12s %12s %-24s %10s %-8s %10s %-8s\n", "run", "idle MiB", "peak MiB", "statuses", "nested s", "status", "flat s", "status")
	for run := range cfg.runs {
		r := amplifyRun{cfg: cfg, dir: dir, token: token, tokens: tokens, n: run}
		idle, peak, statuses, err := r.memory(ctx)
		if err != nil {
			logf("run %d: memory: %v", run+1, err)
			return 1
		}
		nested, nstatus, err := r.cpu(ctx, nestedBody(cfg.nestedSize, cfg.depth))
		if err != nil {
			logf("run %d: nested: %v", run+1, err)
			return 1
		}
		flat, fstatus, err := r.cpu(ctx, flatTokens(cfg.nestedSize))
		if err != nil {
			logf("run %d: flat: %v", run+1, err)
			return 1
		}
		fmt.Fprintf(stdout, "%-4d %12.1f %12.1f %-24s %10.2f %-8d %10.2f %-8d\n", run+1,
			float64(idle)/(1<<20), float64(peak)/(1<<20), statuses, nested.Seconds(), nstatus, flat.Seconds(), fstatus)
	}
	return 0
}

// amplifyToken makes one token and the tokens file that maps it.
func amplifyToken(ctx context.Context, binary, dir string) (token, file string, _ error) {
	var out, line bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, "token", "new", "load")
	cmd.Stdout, cmd.Stderr = &out, &line
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("mcp-outbox token new: %w: %s", err, line.String())
	}
	file = filepath.Join(dir, "tokens")
	if err := os.WriteFile(file, line.Bytes(), 0o600); err != nil {
		return "", "", err
	}
	return strings.TrimSpace(out.String()), file, nil
}

type amplifyRun struct {
	cfg           amplifyConfig
	dir           string
	token, tokens string
	n             int
}

// start runs a fresh serve; stop ends it.
func (r *amplifyRun) start(name string) (cmd *exec.Cmd, url string, stop func(), err error) {
	db := filepath.Join(r.dir, fmt.Sprintf("%s-%d.db", name, r.n))
	args := append([]string{"serve", "--db", db, "--http", "127.0.0.1:0", "--tokens", r.tokens, "--log-level", "error"}, r.cfg.serveArgs...)
	cmd = withGOGC(exec.Command(r.cfg.binary, args...), "")
	if url, err = startServer(cmd); err != nil {
		return nil, "", nil, err
	}
	return cmd, url, func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}, nil
}

// memory sends the concurrent large calls and reads serve's peak RSS
// before and after.
func (r *amplifyRun) memory(ctx context.Context) (idle, peak int64, statuses string, err error) {
	cmd, url, stop, err := r.start("memory")
	if err != nil {
		return 0, 0, "", err
	}
	defer stop()
	procs := []*exec.Cmd{cmd}
	// One small call first, so that idle includes what serving any call
	// costs (the database opened, the first transaction).
	if _, err := r.post(ctx, url, flatBody(16)); err != nil {
		return 0, 0, "", err
	}
	idle = peakRSSOf(procs)
	body := paddedBody(r.cfg.size)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[int]int{}
		first  error
	)
	for range r.cfg.calls {
		wg.Go(func() {
			status, err := r.post(ctx, url, body)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			counts[status]++
		})
	}
	wg.Wait()
	if first != nil {
		return 0, 0, "", first
	}
	peak = peakRSSOf(procs)
	var parts []string
	for _, s := range []int{200, 429, 503, 400, 413} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%dx%d", counts[s], s))
			delete(counts, s)
		}
	}
	for s, n := range counts {
		parts = append(parts, fmt.Sprintf("%dx%d", n, s))
	}
	return idle, peak, strings.Join(parts, ","), nil
}

// cpu sends body to a fresh serve and returns the CPU time serve spent
// on it.
func (r *amplifyRun) cpu(ctx context.Context, body []byte) (time.Duration, int, error) {
	cmd, url, stop, err := r.start("cpu")
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	procs := []*exec.Cmd{cmd}
	if _, err := r.post(ctx, url, flatBody(16)); err != nil {
		return 0, 0, err
	}
	before := cpuOf(procs)
	status, err := r.post(ctx, url, body)
	if err != nil {
		return 0, 0, err
	}
	// The answer may go out before the handler's last work is done; a
	// moment for the process to settle (the measurement is of seconds).
	time.Sleep(100 * time.Millisecond)
	return cpuOf(procs) - before, status, nil
}

// post sends one tools/call and reads its answer whole.
func (r *amplifyRun) post(ctx context.Context, url string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", protoVersion)
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", "charge")
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, nil
}

const amplifyMeta = `"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}`

// paddedBody is a charge of size bytes, the padding in params._meta.
func paddedBody(size int) []byte {
	head := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"amount":100},"_meta":{` +
		amplifyMeta + `,"idempotencyKey":"` + newKey() + `","padding":"`
	tail := `"}}}`
	return []byte(head + strings.Repeat("x", max(size-len(head)-len(tail), 0)) + tail)
}

// flatBody is a charge whose arguments hold n bytes in one string.
func flatBody(n int) []byte {
	return []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"amount":100,"note":"` +
		strings.Repeat("x", n) + `"},"_meta":{` + amplifyMeta + `,"idempotencyKey":"` + newKey() + `"}}}`)
}

// nestedBody is a charge whose arguments hold about n bytes nested so
// that the whole body is depth deep: the message, params and arguments
// are three levels, the rest arrays, each holding its share of the
// padding as small numbers before the next level. Small tokens are what
// a JSON decoder spends its time on; one long string would be skipped
// fast at every level.
func nestedBody(n, depth int) []byte {
	arrays := depth - 3
	share := strings.Repeat("0,", max(n/arrays/2, 0))
	var b strings.Builder
	b.WriteString(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"amount":100,"note":`)
	for range arrays {
		b.WriteString("[" + share)
	}
	b.WriteString("0")
	b.WriteString(strings.Repeat("]", arrays))
	b.WriteString(`},"_meta":{` + amplifyMeta + `,"idempotencyKey":"` + newKey() + `"}}}`)
	return []byte(b.String())
}

// flatTokens is the same padding as nestedBody's, in one flat array.
func flatTokens(n int) []byte {
	return []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"amount":100,"note":[` +
		strings.Repeat("0,", n/2) + `0]},"_meta":{` + amplifyMeta + `,"idempotencyKey":"` + newKey() + `"}}}`)
}
