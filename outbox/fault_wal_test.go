package outbox_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The -wal file deleted while the server is stopped, after a stop that did
// not checkpoint (a crash, SIGKILL, a power loss after the commit's fsync):
// the commits only in the log are gone, as if they had never happened.
// What the main file held (everything up to the last checkpoint) is still
// there. So a retry of a call committed before the checkpoint replays it,
// and a retry of a call whose commit was only in the lost log runs it again,
// under a new call id, whose effects carry new Idempotency-Keys. See
// schema's package doc, "Files".
func TestFault_DeletedWAL(t *testing.T) {
	sqliteOnly(t, "the -wal file")
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "live.db")
	db, err := schema.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := setupOn(t, mustLedger(t, db), nil, nil)

	checkpointed := callCharge(t, b.session, "checkpointed", 100)
	if _, err := db.Write.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	onlyInLog := callCharge(t, b.session, "only-in-log", 200)
	if checkpointed.IsError || onlyInLog.IsError {
		t.Fatal(text(checkpointed), text(onlyInLog))
	}

	// What a stop without a checkpoint leaves on disk is the files as
	// they are now; copy them, all but the -wal. The -shm comes along
	// stale, as it would be left: the next open must not trust it.
	stopped := filepath.Join(t.TempDir(), "stopped.db")
	for _, suffix := range []string{"", "-shm"} {
		copyFile(t, path+suffix, stopped+suffix)
	}
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Fatalf("the live database has no -wal to lose: %v", err)
	}

	// The server starts.
	db2, err := schema.Open(context.Background(), stopped, nil)
	if err != nil {
		t.Fatalf("open after the -wal was deleted: %v", err)
	}
	t.Cleanup(func() { db2.Close() })
	var check string
	if err := db2.Read.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q %v", check, err)
	}
	b2 := setupOn(t, mustLedger(t, db2), nil, nil)

	// Committed and checkpointed: replayed, the same charge.
	r := callCharge(t, b2.session, "checkpointed", 100)
	if r.IsError || callMeta(r)["replayed"] != true || chargeID(t, r) != chargeID(t, checkpointed) {
		t.Errorf("retry of the checkpointed call: %v %s", r.Meta, text(r))
	}
	// Committed only in the lost log: runs again, as a new call.
	r = callCharge(t, b2.session, "only-in-log", 200)
	if r.IsError || callMeta(r)["replayed"] != false {
		t.Fatalf("retry of the call whose commit was lost: %v %s", r.Meta, text(r))
	}
	if callMeta(r)["callId"] == callMeta(onlyInLog)["callId"] {
		t.Errorf("the rerun has the lost call's id %v: its effects would reuse the lost effects' keys", callMeta(r)["callId"])
	}
	if got := charges(t, b2); got != 2 {
		t.Errorf("charges = %d, want 2: the checkpointed one and the rerun", got)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
