package outbox_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// Effects that reach the database for a name the running dispatcher does
// not know (written in SQL, as a cooperating upstream of the proxy does)
// are logged, once per name while they wait, and again if the name comes
// back after its effects were moved. Not parallel: it sets the watch's
// interval, which every layer of this package reads.
func TestLayer_WarnsOfUnknownDestinationWhileRunning(t *testing.T) {
	rounds := make(chan struct{}, 1)
	outbox.SetUnknownDestinationWatch(5*time.Millisecond, func() {
		select {
		case rounds <- struct{}{}:
		default:
		}
	})
	t.Cleanup(func() { outbox.SetUnknownDestinationWatch(time.Minute, nil) })
	logs := &outboxtest.LogBuffer{}
	db := openDB(t)
	l, err := outbox.New(db, &outbox.Options{Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("http://127.0.0.1:1")
	r, err := l.Start(context.Background(), &outbox.StartOptions{ReapInterval: outbox.ReaperOff, TaskScanInterval: -1,
		Dispatcher: &dispatch.Options{Destinations: []dispatch.Destination{{Name: "payments", URL: u}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	const msg = "effects are pending for a destination this dispatcher does not know; " +
		"they wait, and the next Start refuses to run until they are moved or cancelled"
	insert := func(key string) {
		t.Helper()
		if _, err := db.Write.Exec(`INSERT INTO effects (seq, destination, method, path, idempotency_key, state, next_attempt_at, created_at, updated_at)
			VALUES (1, 'paymnets', 'POST', '/v1/charges', $1, 'pending', 0, 0, 0)`, key); err != nil {
			t.Fatal(err)
		}
	}
	// waitRounds waits for n more looks of the watch.
	waitRounds := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-rounds:
			case <-time.After(10 * time.Second):
				t.Fatal("the watch did not look within 10s")
			}
		}
	}
	warnings := func() []map[string]any { return logs.Records(t, msg) }

	insert("upstream-1")
	waitRounds(3)
	recs := warnings()
	if len(recs) != 1 {
		t.Fatalf("warned %d times, want once:\n%s", len(recs), logs.String())
	}
	if recs[0]["destination"] != "paymnets" || recs[0]["pending"] != float64(1) ||
		!strings.Contains(recs[0]["way_out"].(string), "retarget --from paymnets") || !strings.Contains(recs[0]["known"].(string), `"payments"`) {
		t.Errorf("warning %v; want the name, its count, the known names and the retarget command", recs[0])
	}
	// Moved away, then back: named again.
	if _, err := db.Write.Exec(`UPDATE effects SET state = 'cancelled' WHERE destination = 'paymnets'`); err != nil {
		t.Fatal(err)
	}
	waitRounds(2)
	insert("upstream-2")
	waitRounds(2)
	if n := len(warnings()); n != 2 {
		t.Errorf("after the name came back: warned %d times, want 2:\n%s", n, logs.String())
	}
}
