package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// What a task costs against a plain call (issue 25), from outside: one
// mcp-outbox serve --task charge=always per round, on a fresh database,
// and at each --clients level, one after the other on that server,
//
//	plain    charge without the extension declared: a plain answer
//	task     charge with the extension declared: a CreateTaskResult
//	get      tasks/get of the tasks that "task" created, picked at random
//
// The requests are raw JSON-RPC POSTs of stateless 2026-07-28: go-sdk
// v1.8.0's client cannot declare the extension per request in a form the
// server sees as a task request, nor read resultType "task" (its result
// types know complete and input_required only), so the load speaks the
// wire itself, headers included (MCP-Protocol-Version, Mcp-Method,
// Mcp-Name), as Claude Code does.

const (
	tasksExt     = "io.modelcontextprotocol/tasks"
	protoVersion = "2026-07-28"
)

// taskKind is one of the three loads of the tasks mode.
type taskKind int

const (
	kindPlain taskKind = iota
	kindTask
	kindGet
)

var taskKindNames = []string{"plain", "task", "get"}

// wire is a raw 2026-07-28 client: one http.Client shared by the callers,
// with as many idle connections as callers.
type wire struct {
	url string
	hc  *http.Client
	ids atomic.Int64
}

func newWire(url string, clients int) *wire {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = clients
	return &wire{url: url, hc: &http.Client{Transport: tr}}
}

// meta is the per-request _meta of 2026-07-28: the version and the
// client's capabilities are required on every request (the server refuses
// one without clientCapabilities with -32602); a task is asked for by
// declaring the extension there.
func meta(withTasks bool) map[string]any {
	caps := map[string]any{}
	if withTasks {
		caps["extensions"] = map[string]any{tasksExt: map[string]any{}}
	}
	return map[string]any{
		"io.modelcontextprotocol/protocolVersion":    protoVersion,
		"io.modelcontextprotocol/clientCapabilities": caps,
	}
}

// taskAnswer is the part of an answer the load checks: a plain result, a
// CreateTaskResult and a tasks/get answer all carry their fields at the
// top of result.
type taskAnswer struct {
	ResultType string `json:"resultType"`
	TaskID     string `json:"taskId"`
	Status     string `json:"status"`
	IsError    bool   `json:"isError"`
}

// call POSTs one request and decodes its result. The stateless handler
// answers with an SSE stream of one message, or with JSON (errors).
func (w *wire) call(ctx context.Context, method, name string, params map[string]any) (taskAnswer, error) {
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": w.ids.Add(1), "method": method, "params": params})
	if err != nil {
		return taskAnswer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return taskAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", protoVersion)
	req.Header.Set("Mcp-Method", method)
	req.Header.Set("Mcp-Name", name)
	resp, err := w.hc.Do(req)
	if err != nil {
		return taskAnswer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return taskAnswer{}, err
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for l := range strings.SplitSeq(string(raw), "\n") {
			if d, ok := strings.CutPrefix(l, "data: "); ok {
				raw = []byte(d)
				break
			}
		}
	}
	var msg struct {
		Result *taskAnswer `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil {
		return taskAnswer{}, fmt.Errorf("%s: HTTP %d: %q", method, resp.StatusCode, raw)
	}
	if msg.Error != nil {
		return taskAnswer{}, fmt.Errorf("%s: error %d: %s", method, msg.Error.Code, msg.Error.Message)
	}
	if msg.Result == nil {
		return taskAnswer{}, fmt.Errorf("%s: HTTP %d: no result: %q", method, resp.StatusCode, raw)
	}
	return *msg.Result, nil
}

// one makes one request of kind and checks its answer. A new task's id is
// added to tasks.
func (w *wire) one(ctx context.Context, kind taskKind, tasks *taskIDs) error {
	switch kind {
	case kindPlain, kindTask:
		params := map[string]any{"name": "charge", "arguments": map[string]any{"amount": 100}}
		m := meta(kind == kindTask)
		m["idempotencyKey"] = newKey()
		params["_meta"] = m
		a, err := w.call(ctx, "tools/call", "charge", params)
		if err != nil {
			return err
		}
		if kind == kindPlain {
			if a.ResultType != "complete" || a.IsError {
				return fmt.Errorf("plain charge: resultType %q, isError %v", a.ResultType, a.IsError)
			}
			return nil
		}
		if a.ResultType != "task" || a.TaskID == "" || a.Status == "" {
			return fmt.Errorf("task charge: resultType %q, taskId %q, status %q", a.ResultType, a.TaskID, a.Status)
		}
		tasks.add(a.TaskID)
		return nil
	default:
		id := tasks.pick()
		if id == "" {
			return fmt.Errorf("tasks/get: no task to poll")
		}
		a, err := w.call(ctx, "tasks/get", id, map[string]any{"taskId": id, "_meta": meta(true)})
		if err != nil {
			return err
		}
		if a.TaskID != id || a.Status == "" {
			return fmt.Errorf("tasks/get %s: taskId %q, status %q", id, a.TaskID, a.Status)
		}
		return nil
	}
}

// taskIDs are the tasks created so far, which the polls pick from.
type taskIDs struct {
	mu  sync.Mutex
	ids []string
}

func (t *taskIDs) add(id string) {
	t.mu.Lock()
	t.ids = append(t.ids, id)
	t.mu.Unlock()
}

func (t *taskIDs) pick() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ids) == 0 {
		return ""
	}
	return t.ids[rand.IntN(len(t.ids))]
}

// loadKind has clients callers each make requests of kind, one at a time,
// for d.
func loadKind(ctx context.Context, w *wire, kind taskKind, clients int, tasks *taskIDs, d time.Duration) (errs int, lat []time.Duration, err error) {
	deadline := time.Now().Add(d)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
	)
	for range clients {
		wg.Go(func() {
			var mine []time.Duration
			bad := 0
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				cerr := w.one(ctx, kind, tasks)
				took := time.Since(t0)
				if cerr != nil {
					bad++
					mu.Lock()
					if firstErr == nil {
						firstErr = cerr
					}
					mu.Unlock()
					continue
				}
				mine = append(mine, took)
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(lat) == 0 && firstErr != nil {
		return errs, nil, firstErr
	}
	return errs, lat, ctx.Err()
}

// taskReport holds results[level][kind], summed over rounds.
type taskReport struct {
	cfg     config
	command string
	levels  []int
	results [][]*result
}

func measureTasks(ctx context.Context, cfg config, command string, logw io.Writer) (*taskReport, error) {
	logf := func(format string, a ...any) { fmt.Fprintf(logw, "outbox-load: "+format+"\n", a...) }
	dir, err := os.MkdirTemp("", "outbox-load-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if cfg.binary, err = buildOrGiven(ctx, cfg.binary, dir, logf, logw); err != nil {
		return nil, err
	}
	st, stopStore, err := openStore(ctx, cfg.store, dir, logf)
	if err != nil {
		return nil, err
	}
	defer stopStore()
	rep := &taskReport{cfg: cfg, command: command, levels: cfg.levels}
	for range cfg.levels {
		row := make([]*result, len(taskKindNames))
		for k := range row {
			row[k] = &result{}
		}
		rep.results = append(rep.results, row)
	}
	for round := range cfg.rounds {
		db, _, err := st.fresh(ctx)
		if err != nil {
			return nil, err
		}
		args := append([]string{"serve", "--db", db, "--log-level", "error", "--task", "charge=always"}, cfg.serveArgs...)
		args = append(args, "--http", "127.0.0.1:0")
		cmd := withGOGC(exec.Command(cfg.binary, args...), cfg.gogc)
		url, err := startServer(cmd)
		if err != nil {
			return nil, err
		}
		err = func() error {
			tasks := &taskIDs{}
			for li, n := range cfg.levels {
				w := newWire(url, n)
				for k := range taskKindNames {
					kind := taskKind(k)
					logf("tasks, %d clients: round %d: %s", n, round+1, taskKindNames[k])
					if _, _, err := loadKind(ctx, w, kind, n, tasks, cfg.warmup); err != nil {
						return err
					}
					res := rep.results[li][k]
					cpu0, self0 := cpuOf([]*exec.Cmd{cmd}), selfCPU()
					start := time.Now()
					errs, lat, err := loadKind(ctx, w, kind, n, tasks, cfg.duration)
					if err != nil {
						return fmt.Errorf("%d clients, %s: %w", n, taskKindNames[k], err)
					}
					res.elapsed += time.Since(start)
					res.cpu += cpuOf([]*exec.Cmd{cmd}) - cpu0
					res.loadCPU += selfCPU() - self0
					res.calls += len(lat)
					res.errors += errs
					res.latencies = append(res.latencies, lat...)
				}
				w.hc.CloseIdleConnections()
			}
			return nil
		}()
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func (rep *taskReport) write(w io.Writer) {
	store := "SQLite files (WAL, synchronous=FULL)"
	if rep.cfg.store == "postgres" {
		store = "PostgreSQL (fsync on)"
	}
	fmt.Fprintf(w, "outbox-load --tasks: %s, %d rounds of %s per load, on %d CPUs\n",
		store, rep.cfg.rounds, rep.cfg.duration, runtime.NumCPU())
	fmt.Fprintf(w, "command: %s\n", rep.command)
	fmt.Fprintln(w, "server: mcp-outbox serve --task charge=always, one per round on a fresh database; HTTP stateless 2026-07-28, raw JSON-RPC")
	fmt.Fprintln(w, "loads:")
	fmt.Fprintln(w, "  plain  charge without the tasks extension: a plain answer (the baseline)")
	fmt.Fprintln(w, "  task   charge declaring the extension: a CreateTaskResult, the task committed first")
	fmt.Fprintln(w, "  get    tasks/get of a random task created by \"task\" (completed ones, mostly)")
	for li, n := range rep.levels {
		fmt.Fprintf(w, "\ntasks, %d clients\n", n)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "load\tcalls/s\tvs plain\tp50\tp99\tmax\tp99 vs plain\tCPU/call\tload CPU/call\terrors\t")
		plain := rep.results[li][kindPlain]
		for k, r := range rep.results[li] {
			if r.elapsed == 0 {
				continue
			}
			cpu, loadCPU := time.Duration(0), time.Duration(0)
			if r.calls > 0 {
				cpu, loadCPU = r.cpu/time.Duration(r.calls), r.loadCPU/time.Duration(r.calls)
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", taskKindNames[k], r.rate(), ratio(r.rate(), plain.rate()),
				round(r.p(0.5)), round(r.p(0.99)), round(r.p(1)), ratio(float64(r.p(0.99)), float64(plain.p(0.99))),
				cpu.Round(time.Microsecond), loadCPU.Round(time.Microsecond), r.errors)
		}
		tw.Flush()
	}
}
