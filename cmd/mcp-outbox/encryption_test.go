package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"

	_ "modernc.org/sqlite"
)

func writeKeyFile(t *testing.T, dir, name string, ids ...string) (string, map[string]string) {
	t.Helper()
	keys := map[string]string{}
	var lines []string
	for _, id := range ids {
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			t.Fatal(err)
		}
		keys[id] = base64.StdEncoding.EncodeToString(k)
		lines = append(lines, id+":"+keys[id])
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, keys
}

func chargeWith(t *testing.T, cs *mcp.ClientSession, key string, amount int) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge",
		Arguments: map[string]any{"amount": amount}, Meta: mcp.Meta{"idempotencyKey": key}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestEncryptionCLI runs the real binary: serve with a key file seals what
// it records; forget-principal, run while serve runs, erases a call at
// once (its retry runs nothing and says erased, also after a restart);
// reencrypt moves the data keys to a new key, after which serve runs with
// the new key alone and replays.
func TestEncryptionCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "ledger.db")
	keys1, k := writeKeyFile(t, dir, "keys1", "k1")
	cs, _ := serveStdio(t, bin, dbPath, nil, "--encryption-key-file", keys1)
	if res := chargeWith(t, cs, "enc-1", 4242); res.IsError {
		t.Fatal(resultText(res))
	}
	if res := chargeWith(t, cs, "enc-1", 4242); res.IsError || !strings.Contains(resultText(res), "4242") {
		t.Fatalf("replay: %s", resultText(res))
	}
	db, err := sql.Open("sqlite", dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var result string
	if err := db.QueryRow(`SELECT result FROM calls WHERE key = 'enc-1'`).Scan(&result); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(result, "mcpo1:") {
		t.Errorf("stored result %.40q, want sealed", result)
	}
	charges := func() int {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	vars := map[string]string{"MCP_OUTBOX_DB": dbPath}
	r := runCLI(t, vars, "outbox", "forget-principal", "local")
	if r.code != 0 || !strings.Contains(r.stdout, "1 data keys erased, 1 calls") || !strings.Contains(r.stderr, "operator action") {
		t.Fatalf("forget-principal: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "revoke local's tokens at the identity provider") {
		t.Errorf("forget-principal: stdout %q, want the tokens' revocation asked for", r.stdout)
	}
	// An erasure script reads exit 0 as done: an unknown principal (a
	// typo) erased nothing and must not exit 0; one forgotten before does.
	if r := runCLI(t, vars, "outbox", "forget-principal", "nobody"); r.code != 1 ||
		!strings.Contains(r.stderr, "principal user:nobody is unknown") || !strings.Contains(r.stderr, "nothing was erased") ||
		strings.Contains(r.stdout, "forgotten") {
		t.Errorf("forget-principal of an unknown principal: exit %d, stdout %q, stderr %q; want exit 1 saying it is unknown", r.code, r.stdout, r.stderr)
	}
	// Its effect was cancelled with its body erased: a retry sent an
	// empty request, which the destination accepted.
	var effect string
	if err := db.QueryRow(`SELECT e.id FROM effects e JOIN calls c ON c.id = e.call_id WHERE c.key = 'enc-1'`).Scan(&effect); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, vars, "outbox", "retry", effect); r.code != 1 || !strings.Contains(r.stderr, "principal was forgotten") {
		t.Errorf("retry of the forgotten effect: exit %d, stdout %q, stderr %q; want exit 1 saying why", r.code, r.stdout, r.stderr)
	}
	var effectState string
	if err := db.QueryRow(`SELECT state FROM effects WHERE id = ?`, effect).Scan(&effectState); err != nil || effectState != "cancelled" {
		t.Errorf("the forgotten effect after a retry: %q, %v; want cancelled", effectState, err)
	}
	if r := runCLI(t, vars, "outbox", "forget-principal", "local"); r.code != 0 || !strings.Contains(r.stdout, "0 data keys erased") {
		t.Errorf("forget-principal again: exit %d, stdout %q, stderr %q; want exit 0, nothing more erased", r.code, r.stdout, r.stderr)
	}
	erased := func(cs *mcp.ClientSession) {
		t.Helper()
		if res := chargeWith(t, cs, "enc-1", 4242); !res.IsError || !strings.Contains(resultText(res), "erased") {
			t.Errorf("retry after forget: %s, want an erased error", resultText(res))
		}
		if n := charges(); n != 1 {
			t.Errorf("%d charges, want 1: a forgotten call never runs again", n)
		}
	}
	erased(cs) // the running serve
	if r := runCLI(t, vars, "status", "--encryption-key-file", keys1, "enc-1"); r.code != 0 || !strings.Contains(r.stdout, `"state": "erased"`) {
		t.Errorf("status: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	cs.Close()
	cs, _ = serveStdio(t, bin, dbPath, nil, "--encryption-key-file", keys1)
	erased(cs) // after a restart
	if res := chargeWith(t, cs, "enc-2", 77); res.IsError {
		t.Fatal(resultText(res))
	}
	cs.Close()

	// Rotation: k2 leads, k1 still decrypts; reencrypt; then k2 alone.
	both := filepath.Join(dir, "keys2")
	k2line := writeKeyLine(t, dir)
	if err := os.WriteFile(both, []byte(k2line+"\nk1:"+k["k1"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The new key appended, not put first: reencrypt changes nothing and
	// fails, saying why; an exit 0 let a script go on to remove k1, which
	// would leave every row unreadable.
	appended := filepath.Join(dir, "keys-appended")
	if err := os.WriteFile(appended, []byte("k1:"+k["k1"]+"\n"+k2line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	snapshot := func() string {
		t.Helper()
		var s string
		if err := db.QueryRow(`SELECT (SELECT group_concat(id || key_id || hex(wrapped)) FROM data_keys)
			|| (SELECT group_concat(coalesce(result, '')) FROM calls)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()
	r = runCLI(t, vars, "outbox", "reencrypt", "--encryption-key-file", appended)
	if r.code != 2 || !strings.Contains(r.stderr, `every data key is already under "k1", the key file's first key`) ||
		!strings.Contains(r.stderr, `put it first`) || !strings.Contains(r.stderr, "nothing was changed") {
		t.Errorf("reencrypt with the new key last: exit %d, stdout %q, stderr %q; want 2 and it said that the new key goes first", r.code, r.stdout, r.stderr)
	}
	if after := snapshot(); after != before {
		t.Errorf("reencrypt with the new key last changed the database")
	}
	r = runCLI(t, vars, "outbox", "reencrypt", "--encryption-key-file", both, "--batch", "1")
	if r.code != 0 || !strings.Contains(r.stdout, "2 data keys rewrapped") || !strings.Contains(r.stderr, "rewrapped under \"k2\"") {
		t.Fatalf("reencrypt: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// Run again with k1 still in the file, the state is the same as with
	// the keys the wrong way round: refused too, saying k1 may now go.
	r = runCLI(t, vars, "outbox", "reencrypt", "--encryption-key-file", both)
	if r.code != 2 || !strings.Contains(r.stderr, `If the rotation to "k2" is already done, "k1" can leave the key file`) {
		t.Errorf("reencrypt again: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	only2 := filepath.Join(dir, "keys3")
	if err := os.WriteFile(only2, []byte(k2line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cs, _ = serveStdio(t, bin, dbPath, nil, "--encryption-key-file", only2)
	if res := chargeWith(t, cs, "enc-2", 77); res.IsError || !strings.Contains(resultText(res), "77") {
		t.Errorf("replay under k2 alone: %s", resultText(res))
	}
	if n := charges(); n != 2 {
		t.Errorf("%d charges, want 2", n)
	}
}

// encryptedLedger serves a new ledger with key file "keys" (key k1),
// makes a charge of amount under each key and stops; it returns the
// database and the key file.
func encryptedLedger(t *testing.T, amount int, callKeys ...string) (dbPath, keys string) {
	t.Helper()
	dir := t.TempDir()
	dbPath = filepath.Join(dir, "ledger.db")
	keys, _ = writeKeyFile(t, dir, "keys", "k1")
	cs, _ := serveStdio(t, bin, dbPath, nil, "--encryption-key-file", keys)
	for _, key := range callKeys {
		if res := chargeWith(t, cs, key, amount); res.IsError {
			t.Fatal(resultText(res))
		}
	}
	cs.Close()
	return dbPath, keys
}

func writeKeyLine(t *testing.T, dir string) string {
	t.Helper()
	_, keys := writeKeyFile(t, dir, "scratch", "k2")
	return "k2:" + keys["k2"]
}

// TestEncryptionKeyRequiredCLI: on an encrypted database, serve and proxy
// started without the key file refuse at once (exit 2, naming the flag and
// decrypt), and so does drain, before it claims an effect: serve used to
// store plaintext and charge a keyless retry again; drain used to wait out
// --timeout, spending an attempt of every effect.
func TestEncryptionKeyRequiredCLI(t *testing.T) {
	t.Parallel()
	dbPath, keys := encryptedLedger(t, 10, "req-1", "req-2")
	db := openLedgerDB(t, dbPath)
	effects := func() string {
		t.Helper()
		rows, err := db.Query(`SELECT id, state, attempts, next_attempt_at FROM effects ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var id, attempts, next int64
			var state string
			if err := rows.Scan(&id, &state, &attempts, &next); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%d %s %d %d\n", id, state, attempts, next)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	before := effects()
	if strings.Count(before, "pending") != 2 {
		t.Fatalf("effects %q, want 2 pending", before)
	}
	refused := func(name string, code int, stderr string) {
		t.Helper()
		for _, want := range []string{`"k1"`, "--encryption-key-file", "outbox decrypt"} {
			if code != 2 || !strings.Contains(stderr, want) {
				t.Errorf("%s without the key file: exit %d, stderr %q; want 2 and it to say %s", name, code, stderr, want)
				return
			}
		}
	}

	cmd := exec.Command(bin, "serve", "--db", dbPath)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	code := 0
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	refused("serve", code, stderr.String())

	r := runCLI(t, nil, "proxy", "--db", dbPath, "--", "true")
	refused("proxy", r.code, r.stderr)

	fake := downstream.Start(t, nil)
	r = runCLI(t, nil, "drain", "--db", dbPath, "--dest", "payments="+fake.URL(), "--timeout", "20s")
	refused("drain", r.code, r.stderr)
	if after := effects(); after != before || len(fake.Requests()) != 0 {
		t.Errorf("drain without the key file: effects %q, were %q; %d requests; want them untouched", after, before, len(fake.Requests()))
	}
	// With it, drain delivers.
	r = runCLI(t, nil, "drain", "--db", dbPath, "--dest", "payments="+fake.URL(), "--encryption-key-file", keys, "--timeout", "20s")
	if r.code != 0 || !strings.Contains(r.stdout, "delivered 2") {
		t.Errorf("drain with the key file: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestResolveCallSealedCLI: resolve-call stored the operator's note as
// the call's result in plaintext on an encrypted database, and refused
// --encryption-key-file. Now it takes the key file and seals the note,
// which a retry replays; without the key file it changes nothing.
func TestResolveCallSealedCLI(t *testing.T) {
	t.Parallel()
	dbPath, keys := encryptedLedger(t, 4242, "lost")
	db := openLedgerDB(t, dbPath)
	// What a call forwarded to a tool server that never answered leaves.
	if _, err := db.Exec(`UPDATE calls SET state = 'unknown', result = NULL, completed_at = NULL WHERE key = 'lost'`); err != nil {
		t.Fatal(err)
	}
	const note = "NOTE-ch_4242-at-the-processor"
	vars := map[string]string{"MCP_OUTBOX_DB": dbPath}
	args := []string{"outbox", "resolve-call", "--key", "lost", "--outcome", "completed", "--note", note}
	if r := runCLI(t, vars, args...); r.code != 1 || !strings.Contains(r.stderr, "encrypted") || !strings.Contains(r.stderr, "--encryption-key-file") {
		t.Errorf("resolve-call without the key file: exit %d, stderr %q; want exit 1 asking for the key file", r.code, r.stderr)
	}
	var state string
	if err := db.QueryRow(`SELECT state FROM calls WHERE key = 'lost'`).Scan(&state); err != nil || state != "unknown" {
		t.Fatalf("after the refusal: %q, %v; want unknown", state, err)
	}
	if r := runCLI(t, vars, append(args, "--encryption-key-file", keys)...); r.code != 0 || !strings.Contains(r.stdout, "now completed") {
		t.Fatalf("resolve-call with the key file: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	var result string
	if err := db.QueryRow(`SELECT result FROM calls WHERE key = 'lost'`).Scan(&result); err != nil || !strings.HasPrefix(result, "mcpo1:") {
		t.Errorf("stored result %.40q, %v; want sealed", result, err)
	}
	db.Close()
	for _, suffix := range []string{"", "-wal"} {
		raw, err := os.ReadFile(dbPath + suffix)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), note) {
			t.Errorf("the note is in the file%s in plaintext", suffix)
		}
	}
	cs, _ := serveStdio(t, bin, dbPath, nil, "--encryption-key-file", keys)
	defer cs.Close()
	if res := chargeWith(t, cs, "lost", 4242); !strings.Contains(resultText(res), note) {
		t.Errorf("retry after the resolution: %s, want the note replayed", resultText(res))
	}
}
