package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// A file that is not a database, or one cut short, stops every command at
// once with an error naming the file, and no command writes to it.
func TestFault_DamagedDatabaseAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	db, err := schema.Open(context.Background(), good, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write.Exec(`CREATE TABLE pad (x); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
INSERT INTO pad SELECT randomblob(1000) FROM n`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	whole, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{
		"garbage":   bytes.Repeat([]byte("\x00\xffgarbage"), 1000),
		"truncated": whole[:len(whole)/2],
	} {
		path := filepath.Join(dir, name+".db")
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"serve", "--db", path},
			{"serve", "--db", path, "--http", "127.0.0.1:0"},
			{"drain", "--db", path, "--dest", "payments=http://127.0.0.1:9"},
			{"status", "--db", path, "some-key"},
		} {
			r := runCLI(t, nil, args...)
			if r.code == 0 || !strings.Contains(r.stderr, path) || !strings.Contains(r.stderr, "not an SQLite database or is damaged") {
				t.Errorf("%s file, mcp-outbox %s: exit %d, stderr %q; want a failure naming the file and the damage", name, strings.Join(args, " "), r.code, r.stderr)
			}
			after, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(after, content) {
				t.Fatalf("%s file, mcp-outbox %s: the file changed (%v)", name, strings.Join(args, " "), err)
			}
		}
	}
}

// /readyz says not ready while the database cannot record calls (full, or
// read-only), with the database's error in the log and not in the answer,
// and ready again once it can; calls meanwhile say clearly that nothing
// ran, and run once on retry.
func TestFault_ReadyzFullAndReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logs := &syncBuffer{}
	env := testEnv(nil, nil, io.Discard, logs)
	a, err := openApp(ctx, env, &appConfig{db: filepath.Join(t.TempDir(), "ready.db"), durability: "full", logLevel: "error"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	stop, err := a.start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for deadline := time.Now().Add(10 * time.Second); !a.runner.Load().Running(); {
		if time.Now().After(deadline) {
			t.Fatal("dispatcher not running within 10s")
		}
		runtime.Gosched()
	}
	router := testRouter(t, a, a.logger)
	ready := func() (bool, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var body struct {
			Ready  bool              `json:"ready"`
			Checks map[string]string `json:"checks"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("readyz body %q: %v", rec.Body.String(), err)
		}
		if body.Ready != (rec.Code == http.StatusOK) {
			t.Errorf("readyz: %d with ready %v", rec.Code, body.Ready)
		}
		return body.Ready, body.Checks["database"]
	}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := a.server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	charge := func(key string) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 5}, Meta: mcp.Meta{"idempotencyKey": key}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if ok, db := ready(); !ok {
		t.Fatalf("fresh: not ready (%s)", db)
	}

	for _, c := range []struct {
		name, set, reset, says string
	}{
		{"read-only", `PRAGMA query_only = 1`, `PRAGMA query_only = 0`, "readonly"},
		{"full", "", `PRAGMA max_page_count = 1073741823`, "database is full"},
	} {
		set := c.set
		if set == "" { // at the size limit: the pages it has
			var pages int
			if err := a.db.Write.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
				t.Fatal(err)
			}
			set = fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)
		}
		if _, err := a.db.Write.Exec(set); err != nil {
			t.Fatal(err)
		}
		if ok, db := ready(); ok || db != "not ready: see the server's log" || !strings.Contains(logs.String(), c.says) {
			t.Errorf("%s: ready %v, database %q; want not ready, generic, with %q in the log:\n%s", c.name, ok, db, c.says, logs.String())
		}
		// Until a call fills the last free page, a full database still
		// takes calls; once it cannot, the call says nothing ran.
		key := "ready-" + c.name
		failed := false
		for i := 0; i < 50 && !failed; i++ {
			res := charge(fmt.Sprintf("%s-%d-%s", key, i, strings.Repeat("k", 200)))
			if res.IsError {
				failed = true
				key = fmt.Sprintf("%s-%d-%s", key, i, strings.Repeat("k", 200))
				if code, _ := res.Meta[outbox.MetaKeyError].(string); code != "not_recorded" || !strings.Contains(textOf(res), "nothing") {
					t.Errorf("%s: call answered %v %q", c.name, res.Meta, textOf(res))
				}
			}
		}
		if !failed {
			t.Fatalf("%s: 50 calls went through", c.name)
		}
		if _, err := a.db.Write.Exec(c.reset); err != nil {
			t.Fatal(err)
		}
		if ok, db := ready(); !ok {
			t.Errorf("%s, recovered: not ready (%s)", c.name, db)
		}
		if res := charge(key); res.IsError {
			t.Errorf("%s, recovered: retry answered %q", c.name, textOf(res))
		}
	}
}

func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
