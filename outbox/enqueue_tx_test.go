package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// An effect enqueued in the caller's own transaction commits and rolls
// back with it, and the dispatcher delivers the committed one under its key.
func TestLayer_EnqueueTx(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 0, nil)
	ctx := context.Background()

	enqueue := func(path string, keep bool) string {
		t.Helper()
		tx, err := s.db.Write.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO charges (amount, currency, created_at) VALUES ($1, 'usd', 0)`, len(path)); err != nil {
			t.Fatal(err)
		}
		key, err := s.layer.EnqueueTx(ctx, tx, outbox.Effect{Destination: "payments", Path: path, Body: []byte(`{"n":1}`),
			Header: map[string]string{"Content-Type": "application/json"}})
		if err != nil {
			t.Fatal(err)
		}
		// Not visible outside tx before it commits.
		if got := count(t, s.db.Read, `SELECT count(*) FROM effects WHERE idempotency_key = $1`, key); got != 0 {
			t.Fatalf("effect visible before commit")
		}
		if keep {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		} else if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		return key
	}
	rolledBack := enqueue("/v1/rolled-back", false)
	committed := enqueue("/v1/committed", true)
	if got := count(t, s.db.Read, `SELECT count(*) FROM effects WHERE idempotency_key = $1`, rolledBack); got != 0 {
		t.Fatalf("a rolled-back transaction left its effect")
	}
	if got := count(t, s.db.Read, `SELECT count(*) FROM effects WHERE idempotency_key = $1`, committed); got != 1 {
		t.Fatalf("a committed transaction has %d effects, want 1", got)
	}
	if got := count(t, s.db.Read, `SELECT count(*) FROM charges`); got != 1 {
		t.Fatalf("charges = %d, want the committed one", got)
	}

	s.deliver(t)
	reqs := s.fake.Requests()
	if len(reqs) != 1 {
		t.Fatalf("delivered %d requests, want 1", len(reqs))
	}
	if r := reqs[0]; r.Path != "/v1/committed" || r.Key != committed || r.Header.Get("Content-Type") != "application/json" || string(r.Body) != `{"n":1}` {
		t.Fatalf("delivered %s %q key %q, want /v1/committed with key %q", r.Method, r.Path, r.Key, committed)
	}
}

func TestLayer_EnqueueTxBadInput(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 0, nil)
	ctx := context.Background()
	tx, err := s.db.Write.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, tc := range []struct {
		name string
		tx   *sql.Tx
		e    outbox.Effect
		want string
	}{
		{"NilTx", nil, outbox.Effect{Destination: "payments", Path: "/x"}, "nil transaction"},
		{"NoDestination", tx, outbox.Effect{Path: "/x"}, "without destination"},
		{"RelativePath", tx, outbox.Effect{Destination: "payments", Path: "x"}, "must start with /"},
		{"KeyHeader", tx, outbox.Effect{Destination: "payments", Path: "/x", Header: map[string]string{"Idempotency-Key": "k"}}, "Idempotency-Key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.layer.EnqueueTx(ctx, tc.tx, tc.e)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := count(t, s.db.Read, `SELECT count(*) FROM effects`); got != 0 {
		t.Fatalf("bad input left %d effects", got)
	}
}
