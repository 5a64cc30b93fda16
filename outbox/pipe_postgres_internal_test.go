package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The piped outcomes are recordOutcome and recordOutcomeWithEffects with
// a check of the row count: a change to one must reach the other.
func TestPipedOutcome_InStep(t *testing.T) {
	update := strings.TrimSpace(recordOutcome)
	for name, q := range map[string]string{"recordOutcomePiped": recordOutcomePiped, "recordOutcomeWithEffectsPiped": recordOutcomeWithEffectsPiped} {
		if !strings.Contains(squash(q), squash(update)) {
			t.Errorf("%s does not hold recordOutcome's update", name)
		}
		if !strings.Contains(q, "'"+outcomeMissed+"'") {
			t.Errorf("%s does not raise outcomeMissed", name)
		}
	}
	effects := strings.TrimSpace(recordOutcomeWithEffects[:strings.Index(recordOutcomeWithEffects, "UPDATE calls")])
	effects = strings.TrimSuffix(effects, ")")
	if !strings.Contains(squash(recordOutcomeWithEffectsPiped), squash(effects)) {
		t.Errorf("recordOutcomeWithEffectsPiped does not hold recordOutcomeWithEffects's insert")
	}
}

// squash reads SQL as the server does, whatever its line breaks.
func squash(q string) string { return strings.Join(strings.Fields(q), " ") }

// The settled outcomes are the piped ones with the settled row's check:
// the same effects, the same error when nothing matched.
func TestSettledOutcome_InStep(t *testing.T) {
	for name, q := range map[string]string{"recordOutcomeSettledPiped": recordOutcomeSettledPiped, "recordOutcomeSettledWithEffectsPiped": recordOutcomeSettledWithEffectsPiped} {
		if !strings.Contains(q, "'"+outcomeMissed+"'") {
			t.Errorf("%s does not raise outcomeMissed", name)
		}
		if !strings.Contains(squash(q), "WHERE id = $5 AND uid = $6 AND completed_at IS NULL AND owner = ''") {
			t.Errorf("%s does not check that the row is the claim's, without an outcome", name)
		}
	}
	effects := recordOutcomeWithEffectsPiped[:strings.Index(recordOutcomeWithEffectsPiped, "outcome AS")]
	if !strings.Contains(squash(recordOutcomeSettledWithEffectsPiped), squash(effects)) {
		t.Errorf("recordOutcomeSettledWithEffectsPiped does not hold recordOutcomeWithEffectsPiped's insert")
	}
}

// A transaction that holds a claim in the outcome's form never commits
// without the outcome: the row would say completed, with no result.
func TestSettledClaim_NoCommitWithoutOutcome(t *testing.T) {
	ctx := context.Background()
	db, err := schema.Open(ctx, pgtest.Database(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Write.Exec(`CREATE TABLE t (v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	g := newGroupCommit(db, 64, time.Hour, time.Now)
	conn, err := db.Write.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u := g.pipedUnit(conn, true, nil)
	if u == nil {
		t.Fatal("pgx's own driver cannot pipe")
	}
	u.b.piped.settledClaim = true
	var v int
	if err := u.queryFirst(`INSERT INTO t VALUES (1) RETURNING v`, nil, &v); err != nil {
		t.Fatal(err)
	}
	b := u.leave(true)
	<-b.done
	if !errors.Is(b.err, errSettledClaimNoOutcome) {
		t.Fatalf("commit without the outcome: %v; want %v", b.err, errSettledClaimNoOutcome)
	}
	var n int
	if err := db.Read.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows committed (%v); want 0", n, err)
	}
}
