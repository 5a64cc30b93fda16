package outbox

import (
	"strings"
	"testing"
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
