package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/history"
	"github.com/mcp-outbox/mcp-outbox/internal/nemesis"
	"github.com/mcp-outbox/mcp-outbox/internal/testclock"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// The fault campaign (issue 29): replicas of `serve --http` behind a
// round-robin front, clients that record every operation in a history, a
// seeded nemesis, and a checker run over the history and what the store
// and the downstream hold once the faults have healed. The short form
// runs in `make test`; `make jepsen` runs the long one
// (MCP_OUTBOX_JEPSEN_OPS, MCP_OUTBOX_JEPSEN_SEED).

// jepsenOps is the number of operations a campaign runs: the env var's, or
// the short form's.
func jepsenOps(t *testing.T, short int) int {
	if s := os.Getenv("MCP_OUTBOX_JEPSEN_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("MCP_OUTBOX_JEPSEN_OPS=%q: %v", s, err)
		}
		return n
	}
	return short
}

// jepsenRounds is how many faults of each kind a campaign plays at least
// (MCP_OUTBOX_JEPSEN_ROUNDS; one in the short form): the schedule draws
// kinds in rounds, each a permutation of all of them.
func jepsenRounds(t *testing.T) int {
	if s := os.Getenv("MCP_OUTBOX_JEPSEN_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("MCP_OUTBOX_JEPSEN_ROUNDS=%q: want a positive number", s)
		}
		return n
	}
	return 1
}

// jepsenReplica is one serve process that the nemesis may stop, kill and
// start again (on a new port: the front follows it).
type jepsenReplica struct {
	t     *testing.T
	i     int
	db    string // the store as this replica reaches it
	clock string // the file of its clock offset
	args  []string

	mu  sync.Mutex
	cmd *exec.Cmd
	url string // its /mcp URL
}

func (r *jepsenReplica) start() {
	r.t.Helper()
	u, cmd := startHTTP(r.t, failpointBin, r.db, []string{testclock.EnvVar + "=" + r.clock}, r.args...)
	r.mu.Lock()
	r.cmd, r.url = cmd, u
	r.mu.Unlock()
}

func (r *jepsenReplica) signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd.Process.Signal(sig)
}

func (r *jepsenReplica) kill() error {
	r.mu.Lock()
	cmd := r.cmd
	r.mu.Unlock()
	if err := cmd.Process.Kill(); err != nil {
		return err
	}
	_ = cmd.Wait()
	return nil
}

func (r *jepsenReplica) skew(d time.Duration) error {
	return os.WriteFile(r.clock, []byte(d.String()), 0o644)
}

func (r *jepsenReplica) target() *url.URL {
	r.mu.Lock()
	defer r.mu.Unlock()
	u, _ := url.Parse(r.url)
	return u
}

// jepsenFront is the front: each request goes to the next replica, as a
// load balancer without sticky sessions sends them. Clients speak the
// stateless protocol (2026-07-28), which needs no affinity.
func jepsenFront(t *testing.T, replicas []*jepsenReplica) string {
	var next atomic.Uint64
	front := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			r := replicas[int(next.Add(1)%uint64(len(replicas)))]
			pr.SetURL(r.target())
			pr.Out.URL.Path = pr.In.URL.Path
			pr.Out.Header.Set("X-Jepsen-Replica", strconv.Itoa(r.i))
		},
		// A replica that is down or paused is the client's problem to
		// see, as behind a real front: a 502 or its own timeout.
		ErrorLog: nil,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "front: "+err.Error(), http.StatusBadGateway)
		},
	}
	srv := &http.Server{Handler: front}
	ln := listenLocal(t)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/mcp"
}

// campaign is one run's shared state.
type campaign struct {
	t       *testing.T
	h       *history.History
	front   string
	ops     int
	clients int
	// callTimeout bounds one attempt, as a client's request timeout does.
	callTimeout time.Duration

	amount  atomic.Int64
	mu      sync.Mutex
	keyOf   map[int64]string // amount -> key: amounts are unique per key
	stopped atomic.Bool
	// diag, if set, logs the store's state when clients are stuck.
	diag func()
	// claimedAgain counts calls the store shows claimed more than once
	// (a retry that took over an attempt whose lease passed, or that ran
	// again after one recorded nothing).
	claimedAgain int
	// fastForwarded counts effects due more than 10 s ahead when the
	// clients stopped (written under a clock set ahead), made due then.
	fastForwarded int
	// injected lists the faults the nemesis applied, in order.
	injected []nemesis.Fault
	// taskEvery, if not zero, makes every taskEvery-th key of a client a
	// task (the replicas run with --task charge=always): created with the
	// Tasks extension and polled with tasks/get until it ends.
	taskEvery int
	rpcID     atomic.Int64
}

// jepsenTaskArgs are the replicas' flags for the campaign's tasks: a
// charge is a task when the request asks for one, polled often.
var jepsenTaskArgs = []string{"--task", "charge=always", "--task-poll", "100ms"}

var digits = regexp.MustCompile(`[0-9]+`)

// reason shortens an error to what is common to its kind.
func reason(s string) string {
	s = digits.ReplaceAllString(s, "N")
	if len(s) > 90 {
		s = s[:90]
	}
	return s
}

// runClient makes calls under fresh keys, each retried under its key until
// it gets an ok, and reads call_status after an unclear answer and now
// and then after an ok.
func (c *campaign) runClient(ctx context.Context, id int, cs *mcp.ClientSession) {
	for n := 0; ; n++ {
		if c.stopped.Load() || ctx.Err() != nil {
			return
		}
		key := fmt.Sprintf("j-%d-%d", id, n)
		amount := c.amount.Add(1) + 1000
		c.mu.Lock()
		c.keyOf[amount] = key
		c.mu.Unlock()
		if c.taskEvery > 0 && n%c.taskEvery == 1 {
			c.runTask(ctx, cs, id, n, key, int(amount))
			continue
		}
		for attempt := 1; ; attempt++ {
			if ctx.Err() != nil {
				return
			}
			ok := c.call(ctx, cs, id, key, int(amount), attempt)
			if ok {
				if n%3 == 0 {
					c.status(ctx, cs, id, key, attempt)
				}
				break
			}
			c.status(ctx, cs, id, key, attempt)
			backoff := time.NewTimer(min(time.Duration(attempt)*100*time.Millisecond, time.Second))
			select {
			case <-ctx.Done():
				backoff.Stop()
				return
			case <-backoff.C:
			}
		}
	}
}

func (c *campaign) call(ctx context.Context, cs *mcp.ClientSession, id int, key string, amount, attempt int) bool {
	p := c.h.Invoke(id, history.Call, key, attempt, "")
	cctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	res, err := cs.CallTool(cctx, chargeCall(key, amount))
	switch {
	case err != nil:
		p.End(history.Info, "", "", reason(err.Error()))
		return false
	case res.IsError:
		code, _ := res.Meta[outbox.MetaKeyError].(string)
		out := history.Info
		// Only these words say, definitely, that this attempt left
		// nothing: in_progress is also the code of a commit whose answer
		// was lost and could not be read back ("may have been recorded"),
		// an unknown outcome.
		if text := resultText(res); strings.Contains(text, "nothing was executed") || strings.Contains(text, "nothing of it was kept") {
			out = history.Fail
		}
		p.End(out, "", "", code+": "+reason(resultText(res)))
		return false
	}
	m, _ := res.StructuredContent.(map[string]any)
	cid, ok := m["charge_id"].(float64)
	if !ok {
		p.End(history.Info, "", "", "ok without a charge_id")
		return false
	}
	p.End(history.Ok, strconv.FormatInt(int64(cid), 10), "", "")
	return true
}

func (c *campaign) status(ctx context.Context, cs *mcp.ClientSession, id int, key string, attempt int) {
	p := c.h.Invoke(id, history.Status, key, attempt, "")
	cctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: outbox.StatusToolName, Arguments: map[string]any{"key": key}})
	if err != nil {
		p.End(history.Info, "", "", reason(err.Error()))
		return
	}
	if res.IsError {
		p.End(history.Fail, "", "", reason(resultText(res)))
		return
	}
	var st struct {
		State  string          `json:"state"`
		Result json.RawMessage `json:"result"`
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &st); err != nil {
		p.End(history.Info, "", "", "status: "+err.Error())
		return
	}
	p.End(history.Ok, st.State, recordedChargeID(st.Result), "")
}

// runTask makes one key's call as a task: creates it (again under the
// same key until a handle comes back), then polls it until it ends. Now
// and then it asks for the task again once it ended, as a client that lost
// its handle does: the same task must come back.
func (c *campaign) runTask(ctx context.Context, cs *mcp.ClientSession, id, n int, key string, amount int) {
	task := ""
	for attempt := 1; task == ""; attempt++ {
		if ctx.Err() != nil {
			return
		}
		if task = c.createTask(ctx, id, key, amount, attempt); task != "" {
			break
		}
		c.status(ctx, cs, id, key, attempt)
		if !pause(ctx, min(time.Duration(attempt)*100*time.Millisecond, time.Second)) {
			return
		}
	}
	for {
		st := c.pollTask(ctx, id, key, task)
		if history.TaskEnded(st) {
			break
		}
		if !pause(ctx, 100*time.Millisecond) {
			return
		}
	}
	if n%3 == 1 {
		c.createTask(ctx, id, key, amount, 0)
		c.status(ctx, cs, id, key, 0)
	}
}

// pause waits for d, or until ctx ends (false).
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// createTask asks for the charge as a task; it returns the task's id, or
// "" when no handle came back.
func (c *campaign) createTask(ctx context.Context, id int, key string, amount, attempt int) string {
	p := c.h.Invoke(id, history.TaskCall, key, attempt, "")
	r, err := c.rpc(ctx, "tools/call", map[string]any{"name": "charge", "arguments": map[string]any{"amount": amount, "currency": "eur"},
		"_meta": map[string]any{outbox.MetaKeyIdempotency: key}})
	if err != nil {
		p.End(history.Info, "", "", reason(err.Error()))
		return ""
	}
	task, _ := r["taskId"].(string)
	if r["resultType"] != "task" || task == "" {
		out := history.Info
		b, _ := json.Marshal(r)
		if text := string(b); strings.Contains(text, "nothing was executed") || strings.Contains(text, "nothing of it was kept") {
			out = history.Fail
		}
		p.End(out, "", "", "no task: "+reason(string(b)))
		return ""
	}
	p.SetTask(task)
	st, _ := r["status"].(string)
	p.End(history.Ok, st, "", "")
	return task
}

// pollTask reads a task with tasks/get and returns its status ("" when
// the read failed).
func (c *campaign) pollTask(ctx context.Context, id int, key, task string) string {
	p := c.h.Invoke(id, history.TaskPoll, key, 0, "")
	p.SetTask(task)
	r, err := c.rpc(ctx, "tasks/get", map[string]any{"taskId": task})
	var rpcErr *jepsenRPCError
	switch {
	case errors.As(err, &rpcErr) && strings.Contains(rpcErr.Message, "Task not found"):
		p.End(history.Ok, "not_found", "", "")
		return ""
	case err != nil:
		p.End(history.Info, "", "", reason(err.Error()))
		return ""
	}
	st, _ := r["status"].(string)
	res, _ := json.Marshal(r["result"])
	why := ""
	if e, ok := r["error"].(map[string]any); ok {
		why, _ = e["message"].(string)
		why = reason(why)
	}
	p.End(history.Ok, st, recordedChargeID(res), why)
	return st
}

// jepsenRPCError is a JSON-RPC error answer.
type jepsenRPCError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *jepsenRPCError) Error() string { return fmt.Sprintf("jsonrpc %d: %s", e.Code, e.Message) }

// rpc posts one 2026-07-28 request (stateless Streamable HTTP, the
// client's capabilities in _meta, declaring the Tasks extension) to the
// front, bounded by the call timeout, and returns its result.
func (c *campaign) rpc(ctx context.Context, method string, params map[string]any) (map[string]any, error) {
	meta, _ := params["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
	meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "jepsen", "version": "0"}
	meta["io.modelcontextprotocol/clientCapabilities"] = map[string]any{"extensions": map[string]any{outbox.ExtensionTasks: map[string]any{}}}
	params["_meta"] = meta
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.rpcID.Add(1), "method": method, "params": params})
	cctx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, c.front, strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name, ok := params["name"].(string); ok {
		req.Header.Set("Mcp-Name", name)
	} else if id, ok := params["taskId"].(string); ok {
		req.Header.Set("Mcp-Name", id)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	text := string(raw)
	if i := strings.Index(text, "data: "); i >= 0 {
		text = strings.TrimSpace(strings.SplitN(text[i+len("data: "):], "\n", 2)[0])
	}
	var m struct {
		Result map[string]any  `json:"result"`
		Error  *jepsenRPCError `json:"error"`
	}
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		return nil, fmt.Errorf("%s: %s: %s", method, resp.Status, reason(strings.TrimSpace(string(raw))))
	}
	if m.Error != nil {
		return nil, m.Error
	}
	if m.Result == nil {
		return nil, fmt.Errorf("%s: %s: no result", method, resp.Status)
	}
	return m.Result, nil
}

// recordedChargeID reads the charge id out of a recorded result, or "".
func recordedChargeID(raw json.RawMessage) string {
	var r struct {
		StructuredContent struct {
			ChargeID *int64 `json:"charge_id"`
		} `json:"structuredContent"`
	}
	if json.Unmarshal(raw, &r) != nil || r.StructuredContent.ChargeID == nil {
		return ""
	}
	return strconv.FormatInt(*r.StructuredContent.ChargeID, 10)
}

// play runs the clients until the history holds c.ops operations and the
// nemesis has played minFaults faults, with the nemesis alongside; then
// heals, and returns the faults injected.
func (c *campaign) play(faults []nemesis.Fault, acts nemesis.Actions, minFaults int) map[nemesis.Kind]int {
	// Sessions open before the first fault: connectHTTP fails the test
	// from this goroutine only.
	var sessions []*mcp.ClientSession
	for range c.clients {
		sessions = append(sessions, connectHTTP(c.t, c.front, "", httpClient(c.t, "")))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nctx, stopNemesis := context.WithCancel(ctx)
	var played atomic.Int64
	counted := nemesis.Actions{}
	for k, a := range acts {
		counted[k] = nemesis.Action{Do: func(f nemesis.Fault) error {
			c.mu.Lock()
			c.injected = append(c.injected, f)
			c.mu.Unlock()
			c.h.FaultBegin(string(f.Kind))
			return a.Do(f)
		}, Heal: func(f nemesis.Fault) error {
			defer played.Add(1)
			defer c.h.FaultEnd(string(f.Kind))
			return a.Heal(f)
		}}
	}
	var (
		count  map[nemesis.Kind]int
		nemErr error
		done   = make(chan struct{})
	)
	go func() {
		defer close(done)
		count, nemErr = nemesis.Run(nctx, faults, counted, c.t.Logf)
	}()
	var wg sync.WaitGroup
	for id := range c.clients {
		wg.Add(1)
		go func() { defer wg.Done(); c.runClient(ctx, id, sessions[id]) }()
	}
	tick := time.NewTicker(100 * time.Millisecond)
	for len(c.h.Ops()) < c.ops || played.Load() < int64(minFaults) {
		select {
		case <-done:
			// The schedule ran out: clients finish on a healthy system.
			if len(c.h.Ops()) >= c.ops {
				goto stop
			}
			<-tick.C
		case <-tick.C:
		}
	}
stop:
	tick.Stop()
	stopNemesis()
	<-done
	if nemErr != nil {
		c.t.Errorf("%v", nemErr)
	}
	// Faults healed: the keys still being retried must now get an ok.
	c.stopped.Store(true)
	finished := make(chan struct{})
	stoppedAt := time.Now()
	go func() {
		wg.Wait()
		c.t.Logf("clients done %v after the nemesis stopped", time.Since(stoppedAt).Round(time.Millisecond))
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(3 * time.Minute):
		if c.diag != nil {
			c.diag()
		}
		cancel()
		<-finished
		c.t.Errorf("clients still retrying 3 minutes after the faults healed")
	}
	return count
}

// world reads the ground truth once every effect has settled.
func (c *campaign) world(db *sql.DB, fake *downstream.Server) history.World {
	t := c.t
	// A replica whose clock the nemesis set ahead wrote its effects due
	// up to the skew later (on PostgreSQL too: the injected clock is the
	// one the replica counts the database's time from, and a test clock's
	// jumps are kept, where a real wall clock's step would not move the
	// monotonic count). Those are not lost, only deferred: time is moved
	// on for them, once the clients have stopped, so that a run does not
	// wait out the last skew; the summary counts them.
	now := time.Now().UnixMilli()
	res, err := db.Exec(fmt.Sprintf(`UPDATE effects SET next_attempt_at = %d WHERE state = 'pending' AND next_attempt_at > %d`, now, now+10_000))
	if err != nil {
		t.Fatal(err)
	}
	ff, _ := res.RowsAffected()
	c.fastForwarded = int(ff)
	settle := time.Now()
	told := false
	pollReplicas(t, 3*time.Minute, "every effect delivered", func() bool {
		if !told && time.Since(settle) > 20*time.Second {
			// Why delivery lags: the rows say whose lease holds them.
			told = true
			c.logRows(db, `SELECT e.id, e.state, e.attempts, e.lease_owner, e.lease_until, e.next_attempt_at, e.updated_at, left(e.last_error, 120) FROM effects e WHERE e.state <> 'delivered' ORDER BY e.id LIMIT 20`)
		}
		return countRows(t, db, `SELECT count(*) FROM effects WHERE state <> 'delivered'`) == 0
	})
	t.Logf("effects settled %v after the clients stopped", time.Since(settle).Round(time.Millisecond))
	c.claimedAgain = countRows(t, db, `SELECT count(*) FROM calls WHERE attempts > 1`)
	w := history.World{Executions: map[string][]string{}}
	rows, err := db.Query(`SELECT id, amount FROM charges ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, amount int64
		if err := rows.Scan(&id, &amount); err != nil {
			t.Fatal(err)
		}
		k := c.keyOf[amount]
		w.Executions[k] = append(w.Executions[k], strconv.FormatInt(id, 10))
	}
	rows.Close()
	rows, err = db.Query(`SELECT c.key, e.seq, e.idempotency_key FROM effects e JOIN calls c ON c.id = e.call_id ORDER BY e.id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var e history.Effect
		if err := rows.Scan(&e.CallKey, &e.Seq, &e.IdempotencyKey); err != nil {
			t.Fatal(err)
		}
		w.Effects = append(w.Effects, e)
	}
	rows.Close()
	for _, e := range fake.Applied() {
		w.Receipts = append(w.Receipts, e.Key)
	}
	return w
}

// logRows logs the rows of a diagnostic query.
func (c *campaign) logRows(db *sql.DB, q string) {
	rows, err := db.Query(q)
	if err != nil {
		c.t.Logf("diag: %v", err)
		return
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	c.t.Logf("diag: %v (now %d)", cols, time.Now().UnixMilli())
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		_ = rows.Scan(ptrs...)
		c.t.Logf("diag: %v", vals)
	}
}

// check runs the checker and prints the summary table.
func (c *campaign) check(name string, seed uint64, w history.World, count map[nemesis.Kind]int, kinds []nemesis.Kind, elapsed time.Duration) {
	t := c.t
	ops := c.h.Ops()
	anomalies := history.Check(ops, w, 2*time.Minute)
	counts := history.Count(ops)
	var b strings.Builder
	fmt.Fprintf(&b, "\n== %s, seed %d (%s=%d replays it), %v\n", name, seed, nemesis.EnvSeed, seed, elapsed.Round(time.Second))
	fmt.Fprintf(&b, "operations        %d (%d retries), keys %d, executions %d, effects %d, receipts %d\n",
		counts.Total, counts.Retries, len(c.keyOf), len(w.Executions), len(w.Effects), len(w.Receipts))
	for _, k := range []history.Kind{history.Call, history.Status, history.TaskCall, history.TaskPoll} {
		m := counts.ByKind[k]
		fmt.Fprintf(&b, "  %-9s ok %d, fail %d, info %d\n", k, m[history.Ok], m[history.Fail], m[history.Info])
	}
	ends := taskEnds(ops)
	fmt.Fprintf(&b, "tasks             %d: completed %d, failed %d, cancelled %d\n", len(ends), countOf(ends, "completed"), countOf(ends, "failed"), countOf(ends, "cancelled"))
	failedWhy := map[string]string{}
	for _, o := range ops {
		if o.Kind == history.TaskPoll && o.Outcome == history.Ok && (o.Result == "failed" || o.Result == "cancelled") {
			failedWhy[o.Key] = o.Result + ": " + o.Reason
		}
	}
	whyCount := map[string]int{}
	for _, w := range failedWhy {
		whyCount[w]++
	}
	for w, n := range whyCount {
		fmt.Fprintf(&b, "  %6d  task %s\n", n, w)
	}
	fmt.Fprintf(&b, "faults injected (%d began while another held)\n%s", nemesis.Overlapping(c.injected), nemesis.Summary(count, kinds))
	fmt.Fprintf(&b, "calls claimed more than once (taken over, or run again after nothing was recorded) %d\n", c.claimedAgain)
	fmt.Fprintf(&b, "effects due >10 s ahead at the end (written under a clock set ahead), made due then %d\n", c.fastForwarded)
	fmt.Fprintf(&b, "anomalies         %d\n", len(anomalies))
	fmt.Fprintf(&b, "operations by the fault active when invoked: ok / fail / info\n")
	for _, k := range append([]nemesis.Kind{"none"}, kinds...) {
		m := counts.ByFault[string(k)]
		fmt.Fprintf(&b, "  %-14s %6d / %4d / %4d\n", k, m[history.Ok], m[history.Fail], m[history.Info])
	}
	fmt.Fprintf(&b, "fail and info operations by fault and reason (each call retried under its key until ok)\n")
	for _, r := range counts.ReasonsByFault() {
		fmt.Fprintf(&b, "  %s\n", r)
	}
	t.Log(b.String())
	// make jepsen runs go test without -v (the servers' logs would bury
	// it) and prints this file.
	if p := os.Getenv("MCP_OUTBOX_JEPSEN_SUMMARY"); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err == nil {
			fmt.Fprint(f, b.String())
			f.Close()
		}
	}
	for i, a := range anomalies {
		if i == 20 {
			t.Errorf("... and %d more", len(anomalies)-20)
			break
		}
		t.Errorf("anomaly (seed %d): %s", seed, a)
	}
	// Every key a client began ended with an ok once the faults healed,
	// and every task with an end.
	for k, o := range history.LastCallOutcome(ops) {
		if o.Outcome != history.Ok {
			t.Errorf("key %s: last attempt %s (seed %d)", k, o, seed)
		}
	}
	for k, st := range ends {
		if !history.TaskEnded(st) {
			t.Errorf("key %s: its task's last poll read %q (seed %d)", k, st, seed)
		}
	}
}

// taskEnds maps each key made as a task to the status of its last ok poll
// ("" if none).
func taskEnds(ops []history.Op) map[string]string {
	out := map[string]string{}
	for _, o := range ops {
		switch {
		case o.Kind == history.TaskCall:
			if _, ok := out[o.Key]; !ok {
				out[o.Key] = ""
			}
		case o.Kind == history.TaskPoll && o.Outcome == history.Ok:
			out[o.Key] = o.Result
		}
	}
	return out
}

func countOf(m map[string]string, v string) int {
	n := 0
	for _, x := range m {
		if x == v {
			n++
		}
	}
	return n
}

func listenLocal(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// skewFile makes a clock file that says no skew.
func skewFile(t *testing.T, i int) string {
	p := filepath.Join(t.TempDir(), fmt.Sprintf("clock-%d", i))
	if err := os.WriteFile(p, []byte("0s"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
