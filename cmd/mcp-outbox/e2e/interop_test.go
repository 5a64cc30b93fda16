package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver, to count the ledger's rows
)

// The interop test drives the real binary with the official TypeScript MCP
// SDK client (testdata/ts-client/client.mjs) and checks the database
// afterwards. It needs node and the client's npm packages (npm ci in
// testdata/ts-client, which `make test` does); without them it is skipped,
// unless MCP_OUTBOX_REQUIRE_INTEROP=1 makes that a failure.

// tsSDKVersion is the @modelcontextprotocol/sdk version pinned in
// testdata/ts-client/package.json.
const tsSDKVersion = "1.32.2"

// Amounts client.mjs charges, one per logical call, so that rows of the
// charges table can be counted per call.
const (
	amountStdioReplay  = 1111
	amountStdioTimeout = 2222
	amountHTTPReplay   = 3333
)

// tsCall is client.mjs's account of one tools/call.
type tsCall struct {
	Key      string `json:"key"`
	IsError  bool   `json:"isError"`
	Replayed *bool  `json:"replayed"`
	ChargeID *int64 `json:"chargeId"`
	Text     string `json:"text"`
	MS       int    `json:"ms"`
	Error    *struct {
		Code    *int   `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (c tsCall) String() string {
	b, _ := json.Marshal(c)
	return string(b)
}

type tsReplay struct {
	Key    string `json:"key"`
	Amount int64  `json:"amount"`
	First  tsCall `json:"first"`
	Second tsCall `json:"second"`
}

// tsSummary is the JSON line client.mjs prints.
type tsSummary struct {
	Mode       string `json:"mode"`
	SDKVersion string `json:"sdkVersion"`
	Node       string `json:"node"`
	OK         bool   `json:"ok"`
	Error      string `json:"error"`
	MS         int    `json:"ms"`
	Checks     []struct {
		Name   string          `json:"name"`
		OK     bool            `json:"ok"`
		Detail json.RawMessage `json:"detail"`
	} `json:"checks"`
	Replay  *tsReplay `json:"replay"`
	Timeout *struct {
		Key           string `json:"key"`
		Amount        int64  `json:"amount"`
		First         tsCall `json:"first"`
		CancelledSent bool   `json:"cancelledSent"`
		Retry         tsCall `json:"retry"`
	} `json:"timeout"`
	Status map[string]struct {
		State    string `json:"state"`
		Tool     string `json:"tool"`
		Attempts int    `json:"attempts"`
	} `json:"status"`
}

// tsClientDir returns testdata/ts-client, or skips the test (fails it under
// MCP_OUTBOX_REQUIRE_INTEROP=1) when node or the npm packages are missing.
func tsClientDir(t *testing.T) string {
	t.Helper()
	const what = "TypeScript SDK interop"
	skipShortInterop(t, what)
	missing := func(why string) { t.Helper(); skipInterop(t, what, why) }
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "ts-client"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing("node is not in PATH")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		missing("testdata/ts-client/node_modules is missing: run `npm ci` in testdata/ts-client, or `make test`")
	}
	return dir
}

// runTSClient runs `node client.mjs args...` in dir and returns its summary.
// A non-zero exit is reported after the summary's failed checks, so the
// test says which check failed rather than only that node exited 1.
func runTSClient(t *testing.T, dir string, args ...string) *tsSummary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"client.mjs"}, args...)...)
	cmd.Dir = dir
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = testWriter{t} // the client's and the stdio server's stderr
	// The stdio server inherits node's stderr; should it outlive node, stop
	// waiting for the pipe after a while.
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("node client.mjs %s: %v, exit %v", args[0], time.Since(start).Round(time.Millisecond), runErr)
	line := lastLine(stdout.String())
	t.Logf("summary: %s", line)
	var s tsSummary
	if err := json.Unmarshal([]byte(line), &s); err != nil {
		t.Fatalf("client.mjs printed no JSON summary (%v; exit %v); stdout:\n%s", err, runErr, stdout.String())
	}
	for _, c := range s.Checks {
		if !c.OK {
			t.Errorf("client.mjs check failed: %s: %s", c.Name, c.Detail)
		}
	}
	if s.Error != "" {
		t.Errorf("client.mjs: %s", s.Error)
	}
	var exitErr *exec.ExitError
	switch {
	case runErr == nil:
	case errors.As(runErr, &exitErr):
		t.Fatalf("client.mjs exited with %d", exitErr.ExitCode())
	default:
		t.Fatalf("run client.mjs: %v", runErr)
	}
	if s.SDKVersion != tsSDKVersion {
		t.Errorf("client ran @modelcontextprotocol/sdk %q, want %q (run npm ci in testdata/ts-client)", s.SDKVersion, tsSDKVersion)
	}
	if !s.OK {
		t.Errorf("client.mjs summary not ok")
	}
	return &s
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// checkReplay asserts the second call with a key was a replay of the first.
func checkReplay(t *testing.T, r *tsReplay, amount int64) (chargeID int64) {
	t.Helper()
	if r == nil {
		t.Fatal("summary has no replay section")
	}
	if r.Amount != amount {
		t.Errorf("replay charged %d, want %d", r.Amount, amount)
	}
	for _, c := range []tsCall{r.First, r.Second} {
		if c.Error != nil || c.IsError || c.ChargeID == nil {
			t.Fatalf("charge with key %q did not succeed: %v", r.Key, c)
		}
		if c.Key != r.Key {
			t.Errorf("call sent key %q, want %q", c.Key, r.Key)
		}
	}
	if r.First.Replayed == nil || *r.First.Replayed {
		t.Errorf("first call: replayed = %v, want false: %v", r.First.Replayed, r.First)
	}
	if r.Second.Replayed == nil || !*r.Second.Replayed {
		t.Errorf("second call with the same key: replayed = %v, want true: %v", r.Second.Replayed, r.Second)
	}
	if *r.First.ChargeID != *r.Second.ChargeID {
		t.Errorf("replay returned charge %d, the first call charge %d", *r.Second.ChargeID, *r.First.ChargeID)
	}
	return *r.First.ChargeID
}

// checkCharges asserts the charges table holds exactly the given charges,
// one row per logical call, identified by amount and id.
func checkCharges(t *testing.T, dbPath string, want map[int64]int64) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT id, amount FROM charges ORDER BY id`)
	if err != nil {
		t.Fatalf("read charges: %v", err)
	}
	defer rows.Close()
	got := map[int64][]int64{} // amount -> ids
	n := 0
	for rows.Next() {
		var id, amount int64
		if err := rows.Scan(&id, &amount); err != nil {
			t.Fatal(err)
		}
		got[amount] = append(got[amount], id)
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for amount, id := range want {
		if ids := got[amount]; len(ids) != 1 || ids[0] != id {
			t.Errorf("charges of %d: ids %v, want exactly [%d] (one row per logical call)", amount, ids, id)
		}
	}
	if n != len(want) {
		t.Errorf("charges table has %d rows, want %d: %v", n, len(want), got)
	}
	t.Logf("charges table: %d rows for %d logical calls", n, len(want))
}

func TestInteropTypeScriptClient(t *testing.T) {
	t.Parallel()
	dir := tsClientDir(t)

	// Over stdio: (a) a replay; (b) a charge that takes 1s while the client
	// times out after 300ms, retried with the same key; (c) call_status.
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		dbPath := filepath.Join(t.TempDir(), "stdio.db")
		s := runTSClient(t, dir, "stdio", bin, dbPath)

		replayID := checkReplay(t, s.Replay, amountStdioReplay)

		to := s.Timeout
		if to == nil {
			t.Fatal("summary has no timeout section")
		}
		if to.First.Error == nil || to.First.Error.Code == nil || *to.First.Error.Code != -32001 {
			t.Errorf("first attempt with a 300ms timeout: want McpError -32001 (RequestTimeout), got %v", to.First)
		}
		if !to.CancelledSent {
			t.Errorf("the client did not send notifications/cancelled after its timeout")
		}
		if to.Retry.Error != nil || to.Retry.IsError || to.Retry.ChargeID == nil || to.Retry.Key != to.Key {
			t.Fatalf("retry with the same key did not succeed: %v", to.Retry)
		}
		if to.Retry.Replayed != nil && *to.Retry.Replayed {
			// Allowed (still one charge), but means the cancellation came
			// after the first attempt committed, which the timing rules out.
			t.Logf("the retry was a replay: the first attempt committed before its cancellation arrived")
		}

		for _, key := range []string{s.Replay.Key, to.Key} {
			st, ok := s.Status[key]
			if !ok {
				t.Errorf("no call_status answer for key %q", key)
				continue
			}
			if st.State != "completed" || st.Tool != "charge" {
				t.Errorf("call_status %q: state %q tool %q, want completed charge", key, st.State, st.Tool)
			}
		}

		checkCharges(t, dbPath, map[int64]int64{
			amountStdioReplay:  replayID,
			amountStdioTimeout: *to.Retry.ChargeID,
		})
	})

	// Over Streamable HTTP: (d) a replay.
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		dbPath := filepath.Join(t.TempDir(), "http.db")
		url, _ := startHTTP(t, bin, dbPath, nil)
		s := runTSClient(t, dir, "http", url)
		id := checkReplay(t, s.Replay, amountHTTPReplay)
		checkCharges(t, dbPath, map[int64]int64{amountHTTPReplay: id})
	})
}
