package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/internal/ledger"
	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/internal/reencrypt"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The marker every test value carries: found in the raw database, it is a
// leak.
const marker = "ZQX-SECRET-MARKER-7731"

// newKeyLine is a key file line with a fresh random key.
func newKeyLine(t *testing.T, id string) string {
	t.Helper()
	k := make([]byte, seal.KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return id + ":" + base64.StdEncoding.EncodeToString(k)
}

// sealerOf writes a key file of lines and loads its key ring.
func sealerOf(t *testing.T, lines ...string) seal.KeyRing {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ring, err := seal.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return ring
}

// noteBundle is a layer with one tool, note, that echoes its text in its
// result and sends it on in an effect's body and header; runs counts its
// executions.
type noteBundle struct {
	*bundle
	runs *atomic.Int64
}

type noteIn struct {
	Text string `json:"text"`
}

func setupNote(t *testing.T, db *schema.DB, s seal.KeyRing, runs *atomic.Int64) *noteBundle {
	t.Helper()
	if runs == nil {
		runs = new(atomic.Int64)
	}
	l, err := outbox.New(db, &outbox.Options{Keys: s})
	if err != nil {
		t.Fatal(err)
	}
	srv := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	outbox.AddTool(l, srv, &mcp.Tool{Name: "note", Description: "Note a text."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in noteIn) (*mcp.CallToolResult, map[string]string, error) {
			runs.Add(1)
			if _, err := tx.Enqueue(ctx, outbox.Effect{Destination: "notes", Path: "/notes",
				Header: map[string]string{"X-Note": in.Text}, Body: []byte(`{"note":"` + in.Text + `"}`)}); err != nil {
				return nil, nil, err
			}
			if strings.HasPrefix(in.Text, "refuse") {
				// A failed result: recorded, its work (the effect) not kept.
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "refused " + in.Text}}}, nil, nil
			}
			return nil, map[string]string{"echo": "noted " + in.Text}, nil
		}, nil)
	return &noteBundle{bundle: &bundle{db: db, layer: l, server: srv, session: connect(t, srv)}, runs: runs}
}

func note(t *testing.T, b *noteBundle, key, text string) *mcp.CallToolResult {
	t.Helper()
	return call(t, b.session, "note", key, map[string]any{"text": text})
}

// rawStore is every byte of the database outside the application's own
// tables: the SQLite file and its WAL, or a pg_dump of the outbox's tables.
func rawStore(t *testing.T, db *schema.DB, target string) []byte {
	t.Helper()
	if onPostgres() {
		out, err := exec.Command("pg_dump", "--data-only", "-t", "calls", "-t", "effects", "-t", "data_keys", target).Output()
		if err != nil {
			t.Fatalf("pg_dump: %v", err)
		}
		return out
	}
	var all []byte
	for _, suffix := range []string{"", "-wal"} {
		b, err := os.ReadFile(db.Path + suffix)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

func openTarget(t *testing.T, target string) *schema.DB {
	t.Helper()
	db, err := schema.Open(context.Background(), target, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestSeal_NoMarkerAtRest: with a key file, nothing of a call's arguments,
// result, effect body or headers is in the raw file, its WAL or a dump;
// without one (the control) the marker is there, so the scan can see it.
func TestSeal_NoMarkerAtRest(t *testing.T) {
	t.Parallel()
	for _, encrypted := range []bool{false, true} {
		t.Run(map[bool]string{false: "Plaintext", true: "Encrypted"}[encrypted], func(t *testing.T) {
			t.Parallel()
			target := testTarget(t)
			db := openTarget(t, target)
			var s seal.KeyRing
			if encrypted {
				s = sealerOf(t, newKeyLine(t, "k1"))
			}
			b := setupNote(t, db, s, nil)
			for i, key := range []string{"with-key", ""} {
				res := note(t, b, key, marker)
				if res.IsError || !strings.Contains(text(res), marker) {
					t.Fatalf("call %d: %s", i, text(res))
				}
			}
			// The replay reads it back.
			if res := note(t, b, "with-key", marker); res.IsError || !strings.Contains(text(res), "noted "+marker) {
				t.Fatalf("replay: %s", text(res))
			}
			if st := outboxtest.Status(t, b.session, map[string]any{"key": "with-key"}); !strings.Contains(string(st.Result), marker) {
				t.Errorf("call_status result %s, want the marker", st.Result)
			}
			found := bytes.Contains(rawStore(t, db, target), []byte(marker))
			if found == encrypted {
				t.Errorf("marker found in the raw store: %v, want %v", found, !encrypted)
			}
		})
	}
}

func resultOf(t *testing.T, db *schema.DB, key string) string {
	t.Helper()
	var r string
	if err := db.Read.QueryRow(`SELECT result FROM calls WHERE key = $1`, key).Scan(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSeal_Refused: a changed ciphertext, and a ciphertext copied from
// another call's row, are refused, and the call is not run again.
func TestSeal_Refused(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	b := setupNote(t, db, sealerOf(t, newKeyLine(t, "k1")), nil)
	for _, k := range []string{"a", "b", "c"} {
		if res := note(t, b, k, marker+k); res.IsError {
			t.Fatal(text(res))
		}
	}
	ra := resultOf(t, db, "a")
	if !strings.HasPrefix(ra, sealing.Prefix) {
		t.Fatalf("result stored as %.40q, want sealed", ra)
	}
	// Flip one character of the ciphertext of b.
	rb := []byte(resultOf(t, db, "b"))
	i := len(rb) - 5
	rb[i] ^= 'A' ^ 'B'
	if rb[i] == '+' || rb[i] == '/' {
		rb[i] = 'x'
	}
	if _, err := db.Write.Exec(`UPDATE calls SET result = $1 WHERE key = 'b'`, string(rb)); err != nil {
		t.Fatal(err)
	}
	// Copy a's result into c's row.
	if _, err := db.Write.Exec(`UPDATE calls SET result = $1 WHERE key = 'c'`, ra); err != nil {
		t.Fatal(err)
	}
	runs := b.runs.Load()
	for _, k := range []string{"b", "c"} {
		res := note(t, b, k, marker+k)
		if !res.IsError || !strings.Contains(text(res), "fails authentication") {
			t.Errorf("retry of %s: %s, want an error saying it fails authentication", k, text(res))
		}
		if got := errorCode(res); got != "unreadable" {
			t.Errorf("retry of %s: code %q, want unreadable", k, got)
		}
		if strings.Contains(text(res), marker) {
			t.Errorf("retry of %s answered %s", k, text(res))
		}
	}
	if res := note(t, b, "a", marker+"a"); res.IsError || !strings.Contains(text(res), marker+"a") {
		t.Errorf("retry of a: %s, want its result", text(res))
	}
	if got := b.runs.Load(); got != runs {
		t.Errorf("%d runs after the retries, want %d: a refused row must not run the call again", got, runs)
	}
}

// TestSeal_MissingKey: a key file that lacks the key of a principal's data
// key (made under the old key by a process that ran on through a
// rotation) warns at start naming the key id, serves, answers that call
// with an error naming the key and saying a process loads its key file at
// start, and never runs it again.
func TestSeal_MissingKey(t *testing.T) {
	t.Parallel()
	target := testTarget(t)
	db := openTarget(t, target)
	runs := new(atomic.Int64)
	oldKey, newKey := newKeyLine(t, "old-key"), newKeyLine(t, "new-key")
	b := setupNote(t, db, sealerOf(t, oldKey), runs)
	// The rotation moves the hash key to new-key; b, started before with
	// old-key alone, then creates the principal's data key under old-key.
	if _, err := reencrypt.Seal(context.Background(), db, sealing.Of(sealerOf(t, newKey, oldKey)), nil); err != nil {
		t.Fatal(err)
	}
	if res := note(t, b, "k", marker); res.IsError {
		t.Fatal(text(res))
	}
	b2 := setupNote(t, db, sealerOf(t, newKey), runs)
	res := note(t, b2, "k", marker)
	for _, want := range []string{`"old-key"`, "loaded it at start", "restarted after its key file changes"} {
		if !res.IsError || !strings.Contains(text(res), want) {
			t.Errorf("retry answered %s, want an error saying %s", text(res), want)
		}
	}
	if got := errorCode(res); got != "unreadable" {
		t.Errorf("code %q, want unreadable", got)
	}
	// Other calls are served.
	if res := note(t, b2, "other", "x"); res.IsError {
		t.Errorf("a new call: %s", text(res))
	}
	if got := runs.Load(); got != 2 {
		t.Errorf("%d runs, want 2: the call under the missing key must not run again", got)
	}
}

// TestSeal_KeyRequired: New refuses an encrypted database without a key
// file, and with a key file that lacks the key wrapping the hash key:
// either would hash a keyless retry's arguments without the secret and run
// a recorded call again (and the first would store new values in
// plaintext). A database never encrypted, or decrypted, opens without one.
func TestSeal_KeyRequired(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	if _, err := outbox.New(db, nil); err != nil {
		t.Fatalf("never encrypted, no key file: %v", err)
	}
	k1 := sealerOf(t, newKeyLine(t, "k1"))
	runs := new(atomic.Int64)
	if res := note(t, setupNote(t, db, k1, runs), "", marker); res.IsError {
		t.Fatal(text(res))
	}
	for name, s := range map[string]seal.KeyRing{"NoKeyFile": nil, "OtherKey": sealerOf(t, newKeyLine(t, "k2"))} {
		_, err := outbox.New(db, &outbox.Options{Keys: s})
		if !errors.Is(err, outbox.ErrKeyRequired) {
			t.Errorf("%s: New: %v, want ErrKeyRequired", name, err)
			continue
		}
		want := []string{`"k1"`, "--encryption-key-file", "Options.Keys", "outbox decrypt"}
		if s != nil {
			want = []string{`"k1"`, "hash key", "run again"}
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %s", name, err, w)
			}
		}
	}
	var plain int
	if err := db.Read.QueryRow(`SELECT count(*) FROM calls WHERE result NOT LIKE 'mcpo1:%'`).Scan(&plain); err != nil {
		t.Fatal(err)
	}
	if plain != 0 || runs.Load() != 1 {
		t.Errorf("%d plaintext results, %d runs; want 0 and 1", plain, runs.Load())
	}
	if _, err := reencrypt.Decrypt(context.Background(), db, sealing.Of(k1), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.New(db, nil); err != nil {
		t.Errorf("decrypted, no key file: %v", err)
	}
}

// TestSeal_SameIDOtherKey: a key file whose key under an id is not the one
// that wrapped the database's data keys (a key made anew under the old id)
// is named as that, not as a changed row.
func TestSeal_SameIDOtherKey(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	if res := note(t, setupNote(t, db, sealerOf(t, newKeyLine(t, "k1")), nil), "a", marker); res.IsError {
		t.Fatal(text(res))
	}
	_, err := outbox.New(db, &outbox.Options{Keys: sealerOf(t, newKeyLine(t, "k1"))})
	if err == nil || !strings.Contains(err.Error(), `the key file's "k1" is not the key that wrapped it`) {
		t.Errorf("another key under the same id: %v, want an error saying so", err)
	}
}

// TestSeal_ReencryptAfterForget: reencrypt leaves a forgotten principal's
// erased effects alone; it used to seal their emptied headers, which gave
// the forgotten principal a live data key again.
func TestSeal_ReencryptAfterForget(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	s := sealerOf(t, newKeyLine(t, "k1"))
	if res := note(t, setupNote(t, db, s, nil), "a", marker); res.IsError {
		t.Fatal(text(res))
	}
	ctx := context.Background()
	if _, err := admin.ForgetPrincipal(ctx, db, "local", time.Now()); err != nil {
		t.Fatal(err)
	}
	r, err := reencrypt.Seal(ctx, db, sealing.Of(s), nil)
	if err != nil {
		t.Fatal(err)
	}
	var live int
	if err := db.Read.QueryRow(`SELECT count(*) FROM data_keys WHERE principal = 'local' AND erased_at IS NULL`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if r.Effects != 0 || live != 0 {
		t.Errorf("reencrypt after forget: %+v, %d live data keys of the forgotten principal; want nothing rewritten and none", r, live)
	}
}

// TestSeal_Migration: a database with plaintext rows stays readable once
// encryption is on (results and plain args hashes), new rows are sealed,
// and reencrypt's conversion seals the old ones.
func TestSeal_Migration(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	runs := new(atomic.Int64)
	plain := setupNote(t, db, nil, runs)
	if res := note(t, plain, "old", marker); res.IsError {
		t.Fatal(text(res))
	}
	s := sealerOf(t, newKeyLine(t, "k1"))
	b := setupNote(t, db, s, runs)
	if res := note(t, b, "old", marker); res.IsError || !strings.Contains(text(res), "noted "+marker) {
		t.Fatalf("replay of a plaintext row: %s", text(res))
	}
	if res := note(t, b, "new", marker); res.IsError {
		t.Fatal(text(res))
	}
	if got := runs.Load(); got != 2 {
		t.Errorf("%d runs, want 2: the old row replays", got)
	}
	if r := resultOf(t, db, "new"); !strings.HasPrefix(r, sealing.Prefix) {
		t.Errorf("new row's result %.40q, want sealed", r)
	}
	if r := resultOf(t, db, "old"); strings.HasPrefix(r, sealing.Prefix) {
		t.Errorf("old row's result sealed before reencrypt")
	}
	if _, err := reencrypt.Seal(context.Background(), db, sealing.Of(s), &reencrypt.Options{Batch: 1}); err != nil {
		t.Fatal(err)
	}
	if r := resultOf(t, db, "old"); !strings.HasPrefix(r, sealing.Prefix) {
		t.Errorf("old row's result %.40q after reencrypt, want sealed", r)
	}
	if n := unsealedEffects(t, db); n != 0 {
		t.Errorf("%d effects not sealed after reencrypt", n)
	}
	if res := note(t, b, "old", marker); res.IsError || !strings.Contains(text(res), "noted "+marker) {
		t.Fatalf("replay after reencrypt: %s", text(res))
	}
	// Turning it off is explicit: decrypt, after which a layer without a
	// key file replays everything.
	if _, err := reencrypt.Decrypt(context.Background(), db, sealing.Of(s), &reencrypt.Options{Batch: 1}); err != nil {
		t.Fatal(err)
	}
	off := setupNote(t, db, nil, runs)
	for _, k := range []string{"old", "new"} {
		if res := note(t, off, k, marker); res.IsError || !strings.Contains(text(res), "noted "+marker) {
			t.Errorf("replay of %s after decrypt: %s", k, text(res))
		}
	}
	if got := runs.Load(); got != 2 {
		t.Errorf("%d runs, want 2", got)
	}
}

// TestSeal_Forget: forgetting a principal erases its results at once, in
// a running layer; a retry runs nothing and call_status says erased, also
// after a restart; other principals are untouched.
func TestSeal_Forget(t *testing.T) {
	t.Parallel()
	target := testTarget(t)
	db := openTarget(t, target)
	runs := new(atomic.Int64)
	s := sealerOf(t, newKeyLine(t, "k1"))
	b := setupNote(t, db, s, runs)
	if res := note(t, b, "gone", marker); res.IsError {
		t.Fatal(text(res))
	}
	if res := note(t, b, "", marker+"-fp"); res.IsError {
		t.Fatal(text(res))
	}
	f, err := admin.ForgetPrincipal(context.Background(), db, "local", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.DataKeys != 1 || f.Calls != 2 || f.Effects != 2 {
		t.Errorf("forgot %+v, want 1 data key, 2 calls, 2 effects", f)
	}
	check := func(b *noteBundle) {
		t.Helper()
		for _, k := range []string{"gone", ""} {
			res := note(t, b, k, marker+map[string]string{"": "-fp"}[k])
			if !res.IsError || !strings.Contains(text(res), "erased") || strings.Contains(text(res), marker) {
				t.Errorf("retry of %q: %s, want an erased error", k, text(res))
			}
			// Not not_recorded, which tells a client that a retry runs
			// the call: it never will.
			if got := errorCode(res); got != "erased" {
				t.Errorf("retry of %q: code %q, want erased", k, got)
			}
		}
		if st := outboxtest.Status(t, b.session, map[string]any{"key": "gone"}); st.State != query.Erased || len(st.Result) != 0 {
			t.Errorf("call_status: %s %s, want erased without a result", st.State, st.Result)
		}
		if got := runs.Load(); got != 2 {
			t.Errorf("%d runs, want 2: a forgotten call never runs again", got)
		}
	}
	check(b)
	db.Close()
	db2 := openTarget(t, target)
	check(setupNote(t, db2, s, runs))
	if bytes.Contains(rawStore(t, db2, target), []byte(marker)) {
		t.Error("marker in the raw store after forget")
	}
	// A new call of the principal gets a new data key.
	if res := note(t, setupNote(t, db2, s, runs), "after", marker); res.IsError || !strings.Contains(text(res), marker) {
		t.Errorf("a new call after forget: %s", text(res))
	}
}

// TestSeal_ForgetLeavesNoWrappedKey: after a forget on SQLite, the
// principal's wrapped data key stayed in the -wal file and in the freed
// space of its page, so a copy of the files with the key file still
// unwrapped it. Now neither file holds it, while the layer still runs.
func TestSeal_ForgetLeavesNoWrappedKey(t *testing.T) {
	t.Parallel()
	sqliteOnly(t, "the SQLite files are read; PostgreSQL keeps dead tuples and WAL segments (see the README)")
	db := openTarget(t, testTarget(t))
	b := setupNote(t, db, sealerOf(t, newKeyLine(t, "k1")), nil)
	for _, k := range []string{"a", "b", "c"} {
		if res := note(t, b, k, marker); res.IsError {
			t.Fatal(text(res))
		}
	}
	var wrapped []byte
	if err := db.Read.QueryRow(`SELECT wrapped FROM data_keys WHERE principal = 'local' AND purpose = 'seal'`).Scan(&wrapped); err != nil {
		t.Fatal(err)
	}
	if len(wrapped) < 16 || !bytes.Contains(rawStore(t, db, ""), wrapped) {
		t.Fatalf("wrapped key of %d bytes not in the files before the forget: the test would prove nothing", len(wrapped))
	}
	f, err := admin.ForgetPrincipal(context.Background(), db, "local", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if f.DataKeys != 1 || f.WALPending {
		t.Errorf("forgot %+v, want 1 data key and the WAL checkpointed", f)
	}
	for _, suffix := range []string{"", "-wal"} {
		raw, err := os.ReadFile(db.Path + suffix)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if bytes.Contains(raw, wrapped) {
			t.Errorf("the wrapped data key is still in the file%s after the forget", suffix)
		}
	}
	// The layer goes on: a new call of the principal gets a new data key.
	if res := note(t, b, "after", marker); res.IsError || !strings.Contains(text(res), marker) {
		t.Errorf("a new call after forget: %s", text(res))
	}
}

// TestSeal_ResolveCallSealsNote: an operator's resolution of an unknown
// call was recorded as the one plaintext result of an encrypted database.
// It is sealed like the layer's own, a retry replays it, and without the
// Sealer it is refused with nothing changed.
func TestSeal_ResolveCallSealsNote(t *testing.T) {
	t.Parallel()
	target := testTarget(t)
	db := openTarget(t, target)
	s := sealerOf(t, newKeyLine(t, "k1"))
	runs := new(atomic.Int64)
	b := setupNote(t, db, s, runs)
	if res := note(t, b, "lost", "x"); res.IsError {
		t.Fatal(text(res))
	}
	// What a call forwarded to a tool server that never answered leaves.
	if _, err := db.Write.Exec(`UPDATE calls SET state = 'unknown', result = NULL, completed_at = NULL WHERE key = 'lost'`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref := admin.CallRef{Principal: "local", Key: "lost"}
	err := admin.ResolveCall(ctx, db, ref, admin.Resolution{Outcome: admin.CallCompleted, Note: marker})
	if !errors.Is(err, admin.ErrSealerNeeded) {
		t.Errorf("resolve without the Sealer: %v, want ErrSealerNeeded", err)
	}
	if n := outboxtest.Count(t, db.Read, `SELECT count(*) FROM calls WHERE key = 'lost' AND state = 'unknown' AND result IS NULL`); n != 1 {
		t.Fatal("the refused resolution changed the call")
	}
	if err := admin.ResolveCall(ctx, db, ref, admin.Resolution{Outcome: admin.CallCompleted, Note: marker, Sealer: sealing.Of(s)}); err != nil {
		t.Fatal(err)
	}
	if r := resultOf(t, db, "lost"); !strings.HasPrefix(r, sealing.Prefix) {
		t.Errorf("resolved result %.40q, want sealed", r)
	}
	if bytes.Contains(rawStore(t, db, target), []byte(marker)) {
		t.Error("the note is in the raw store")
	}
	if res := note(t, b, "lost", "x"); res.IsError || !strings.Contains(text(res), marker) || runs.Load() != 1 {
		t.Errorf("retry after the resolution: %s (%d runs), want the note replayed, not run", text(res), runs.Load())
	}
}

// unsealedEffects counts the effects whose headers or body are plaintext.
func unsealedEffects(t *testing.T, db *schema.DB) int {
	t.Helper()
	rows, err := db.Read.Query(`SELECT headers, body FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var h string
		var body []byte
		if err := rows.Scan(&h, &body); err != nil {
			t.Fatal(err)
		}
		if !sealing.IsSealed([]byte(h)) || (body != nil && !sealing.IsSealed(body)) {
			n++
		}
	}
	return n
}

// TestSeal_Rotation: after a new key leads the key file and reencrypt ran,
// the old key leaves the file and everything still replays, and the
// effects sealed under it are delivered with their body and headers.
func TestSeal_Rotation(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	runs := new(atomic.Int64)
	k1, k2 := newKeyLine(t, "k1"), newKeyLine(t, "k2")
	b := setupNote(t, db, sealerOf(t, k1), runs)
	for _, k := range []string{"r1", "r2", ""} {
		if res := note(t, b, k, marker+k); res.IsError {
			t.Fatal(text(res))
		}
	}
	both := sealerOf(t, k2, k1)
	var progress bytes.Buffer
	r, err := reencrypt.Seal(context.Background(), db, sealing.Of(both), &reencrypt.Options{Batch: 1, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if r.DataKeys != 2 || r.Calls != 0 || r.Effects != 0 {
		t.Errorf("reencrypt %+v, want the principal's and the hash key rewrapped, no value rewritten", r)
	}
	if !strings.Contains(progress.String(), "rewrapped") {
		t.Errorf("progress %q", progress.String())
	}
	if n := count(t, db.Read, `SELECT count(*) FROM data_keys WHERE key_id <> 'k2'`); n != 0 {
		t.Errorf("%d data keys still under k1", n)
	}
	// Run again: nothing left to do.
	if r, err := reencrypt.Seal(context.Background(), db, sealing.Of(both), nil); err != nil || r.DataKeys != 0 {
		t.Errorf("second reencrypt: %+v %v", r, err)
	}

	b2 := setupNote(t, db, sealerOf(t, k2), runs)
	for _, k := range []string{"r1", "r2", ""} {
		if res := note(t, b2, k, marker+k); res.IsError || !strings.Contains(text(res), "noted "+marker+k) {
			t.Errorf("replay of %q with k1 gone: %s", k, text(res))
		}
	}
	if got := runs.Load(); got != 3 {
		t.Errorf("%d runs, want 3", got)
	}
	fake := downstream.Start(t, nil)
	u, _ := url.Parse(fake.URL())
	start(t, b2.bundle, &outbox.StartOptions{Dispatcher: &dispatch.Options{Destinations: []dispatch.Destination{{Name: "notes", URL: u}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fake.WaitRequests(ctx, 3); err != nil {
		t.Fatal(err)
	}
	for _, req := range fake.Requests() {
		if !bytes.Contains(req.Body, []byte(marker)) || !strings.HasPrefix(req.Header.Get("X-Note"), marker) {
			t.Errorf("delivered %q with X-Note %q, want the marker in both", req.Body, req.Header.Get("X-Note"))
		}
	}
	pollUntil(t, "effects delivered", func() bool {
		return count(t, db.Read, `SELECT count(*) FROM effects WHERE state = 'delivered'`) == 3
	})
	if n := count(t, db.Read, `SELECT count(*) FROM effects WHERE response IS NOT NULL AND response <> ''`); n != 0 {
		t.Errorf("%d destination responses kept, want none with encryption on", n)
	}
}

// TestSeal_TaskRecovered: a task's stored arguments are sealed while it
// runs, and a layer with the key file takes over the task of a dead owner
// from them and completes it; its result reads back through tasks/get.
func TestSeal_TaskRecovered(t *testing.T) {
	t.Parallel()
	db := mustLedger(t, openDB(t))
	s := sealerOf(t, newKeyLine(t, "k1"))
	setupSealed := func(lopts *ledger.Options) *bundle {
		if lopts == nil {
			lopts = &ledger.Options{}
		}
		lopts.Tasks = map[string]outbox.TaskOptions{"charge": {Mode: outbox.TasksAlways, After: 50 * time.Millisecond, PollInterval: 20 * time.Millisecond}}
		return setupOn(t, db, &outbox.Options{Keys: s}, lopts)
	}
	g := newGate()
	a := setupSealed(&ledger.Options{Gate: g.hold})
	id := result(t, stdioPeer(t, a.server).charge(true, "sealed-task", 9))["taskId"].(string)
	g.waitReached(t)
	var params string
	if err := db.Read.QueryRow(`SELECT task_params FROM calls WHERE task_id = $1`, id).Scan(&params); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(params, sealing.Prefix) {
		t.Errorf("task_params stored as %.40q, want sealed", params)
	}
	if onPostgres() {
		mustExec(t, db, `UPDATE calls SET owner = 'gone/1#1', lease_until = 0 WHERE task_id = $1`, id)
	} else {
		mustExec(t, db, `UPDATE calls SET owner = $1 WHERE task_id = $2`, deadOwner(t), id)
	}
	b := setupSealed(nil)
	running, err := b.layer.Start(context.Background(), &outbox.StartOptions{NoDispatcher: true, ReapInterval: outbox.ReaperOff})
	if err != nil {
		t.Fatal(err)
	}
	done := stdioPeer(t, b.server).waitTask(id)
	if err := running.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if done["status"] != "completed" {
		t.Fatalf("recovered task = %v", done)
	}
	close(g.release)
	outbox.WaitTasks(a.layer)
	if got := charges(t, a); got != 1 {
		t.Errorf("charges = %d, want exactly 1", got)
	}
	var res string
	if err := db.Read.QueryRow(`SELECT result FROM calls WHERE task_id = $1`, id).Scan(&res); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res, sealing.Prefix) {
		t.Errorf("task's result stored as %.40q, want sealed", res)
	}
}

// TestSeal_FingerprintAcrossTurnOn: a call without a key made just before
// encryption was turned on still names its identical call, within its
// window, for the claim and for call_status.
func TestSeal_FingerprintAcrossTurnOn(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	runs := new(atomic.Int64)
	if res := note(t, setupNote(t, db, nil, runs), "", marker); res.IsError {
		t.Fatal(text(res))
	}
	b := setupNote(t, db, sealerOf(t, newKeyLine(t, "k1")), runs)
	if res := note(t, b, "", marker); res.IsError || !strings.Contains(text(res), "noted "+marker) {
		t.Fatalf("identical call after turning encryption on: %s", text(res))
	}
	if got := runs.Load(); got != 1 {
		t.Errorf("%d runs, want 1: the identical call replays", got)
	}
	st := outboxtest.Status(t, b.session, map[string]any{"tool": "note", "arguments": map[string]any{"text": marker}})
	if st.State != query.Completed {
		t.Errorf("call_status by arguments: %s, want completed", st.State)
	}
}

// A principal's first call that enqueues an effect and then fails: the
// failure keeps nothing of its work, and the data key made for the
// effect went with it. The recorded failure must be sealed under a key
// that stays, or its replay cannot be opened.
func TestSeal_FailedFirstCallReplays(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	b := setupNote(t, db, sealerOf(t, newKeyLine(t, "k1")), nil)
	first := note(t, b, "refuse-1", "refuse me")
	if !first.IsError || !strings.Contains(text(first), "refused refuse me") {
		t.Fatalf("first answer = %s %q; want the failure", errorCode(first), text(first))
	}
	again := note(t, b, "refuse-1", "refuse me")
	if !again.IsError || !strings.Contains(text(again), "refused refuse me") || callMeta(again)["replayed"] != true {
		t.Fatalf("replay = %s %q (meta %v); want the recorded failure, replayed", errorCode(again), text(again), callMeta(again))
	}
	if n := b.runs.Load(); n != 1 {
		t.Errorf("runs = %d, want 1", n)
	}
}
