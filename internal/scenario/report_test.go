package scenario

import (
	"bytes"
	"strings"
	"testing"
)

// TestReport_WriteTable checks the table's shape on a report, without running
// anything.
func TestReport_WriteTable(t *testing.T) {
	rep := &Report{OK: true, Summary: strings.Repeat("word ", 40)}
	for _, sc := range All() {
		rep.Scenarios = append(rep.Scenarios, Outcome{Scenario: sc,
			Charges: map[Mode]int{Bare: 2, LayerKey: 1, LayerNoKey: 1}})
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[1], "without the layer") || !strings.Contains(lines[1], "layer + key") || !strings.Contains(lines[1], "layer, no key") {
		t.Errorf("header: %q", lines[1])
	}
	for i, sc := range All() {
		f := strings.Fields(lines[2+i])
		if f[0] != sc.Number || strings.Join(f[len(f)-4:], " ") != "1 2 1 1" {
			t.Errorf("row %d: %q", i+1, lines[2+i])
		}
	}
	for _, l := range lines {
		if strings.HasSuffix(l, " ") || len(l) > 200 {
			t.Errorf("line %q: trailing space or too long", l)
		}
	}
}
