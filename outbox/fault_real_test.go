package outbox_test

import (
	"fmt"
	"strings"
	"testing"
)

// The conditions themselves, not injected errors: a database at its size
// limit (PRAGMA max_page_count, which fails an insert with SQLITE_FULL as a
// full disk does) and one that refuses writes (PRAGMA query_only, which
// fails them with SQLITE_READONLY as a read-only file does). Both are
// settings of the writer connection, so they hold for every write of the
// layer.

// fillToLimit caps the writer at the pages it has: from now on every
// write that needs a new page fails with SQLITE_FULL.
func fillToLimit(t *testing.T, b *bundle) {
	t.Helper()
	var pages int
	if err := b.db.Write.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Write.Exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)); err != nil {
		t.Fatal(err)
	}
}

func TestFault_RealFullDatabase(t *testing.T) {
	sqliteOnly(t, "a full or read-only database file")
	t.Parallel()
	b := setup(t, nil, nil)
	fillToLimit(t, b)
	// Calls with long keys fill the pages' free space, then fail.
	// Whichever write hits the limit (the claim, the handler's insert, the
	// effect, the outcome), the call must say it did not run.
	key := func(i int) string { return fmt.Sprintf("full-%03d-%s", i, strings.Repeat("x", 200)) }
	var failed []int
	for i := range 60 {
		res := callCharge(t, b.session, key(i), 1+i)
		if !res.IsError {
			continue
		}
		if err := actionable(errorCode(res), text(res)); err != nil || !strings.Contains(text(res), "the database is full") {
			t.Fatalf("call %d on a full database: %v: %s", i, err, text(res))
		}
		failed = append(failed, i)
	}
	if len(failed) == 0 {
		t.Fatal("no call failed: the database never filled")
	}
	if got := count(t, b.db.Read, `SELECT count(*) FROM calls WHERE state != 'completed'`); got != 0 {
		t.Errorf("%d calls recorded in another state than completed: a full database became an outcome", got)
	}
	before := charges(t, b)

	// Room again: each failed call runs once on retry, the others replay.
	if _, err := b.db.Write.Exec(`PRAGMA max_page_count = 1073741823`); err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		res := callCharge(t, b.session, key(i), 1+i)
		if res.IsError {
			t.Fatalf("retry %d after the database has room: %s", i, text(res))
		}
	}
	if got := charges(t, b); got != before+len(failed) || got != 60 {
		t.Errorf("charges = %d (%d before the retries, %d failed calls), want 60", got, before, len(failed))
	}
}

func TestFault_RealReadOnlyDatabase(t *testing.T) {
	sqliteOnly(t, "a full or read-only database file")
	t.Parallel()
	b := setup(t, nil, nil)
	if res := callCharge(t, b.session, "ro-before", 1); res.IsError {
		t.Fatal(text(res))
	}
	if _, err := b.db.Write.Exec(`PRAGMA query_only = 1`); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ro-1", ""} {
		res := callCharge(t, b.session, key, 2)
		if err := actionable(errorCode(res), text(res)); err != nil || !strings.Contains(text(res), "the database is read-only") {
			t.Fatalf("call %q on a read-only database: %v: %s", key, err, text(res))
		}
	}
	// A recorded call is not replayed either: its claim begins a write
	// transaction. It says so, and replays once the database is writable.
	if res := callCharge(t, b.session, "ro-before", 1); errorCode(res) != "not_recorded" {
		t.Errorf("retry of a recorded call on a read-only database: %v %s", res.Meta, text(res))
	}
	if _, err := b.db.Write.Exec(`PRAGMA query_only = 0`); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ro-1", ""} {
		if res := callCharge(t, b.session, key, 2); res.IsError || callMeta(res)["replayed"] != false {
			t.Fatalf("retry %q once writable: %v %s", key, res.Meta, text(res))
		}
	}
	if res := callCharge(t, b.session, "ro-before", 1); res.IsError || callMeta(res)["replayed"] != true {
		t.Errorf("replay once writable: %v %s", res.Meta, text(res))
	}
	if got := charges(t, b); got != 3 {
		t.Errorf("charges = %d, want 3", got)
	}
}
