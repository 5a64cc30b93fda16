package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestNewResult(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		figure, baseline float64
		target           Target
		wantRatio        float64
		wantMet          bool
	}{
		{"AtLeastRatioMet", 900, 1000, AtLeastRatio(0.9), 0.9, true},
		{"AtLeastRatioMissed", 899, 1000, AtLeastRatio(0.9), 0.899, false},
		{"AtMostRatioMet", 110, 100, AtMostRatio(1.1), 1.1, true},
		{"AtMostFigureMissed", 201, 10, AtMost(200), 20.1, false},
		{"NoBaseline", 5, 0, AtMost(200), 0, true},
		{"NoBaselineRatioTarget", 5, 0, AtLeastRatio(0.5), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newResult(1, "m", "u", tc.figure, tc.baseline, "b", tc.target)
			if d := r.Ratio - tc.wantRatio; d > 1e-9 || d < -1e-9 {
				t.Errorf("ratio = %v, want %v", r.Ratio, tc.wantRatio)
			}
			if r.Met != tc.wantMet {
				t.Errorf("met = %v, want %v", r.Met, tc.wantMet)
			}
		})
	}
}

func sampleReport() *Report {
	r2 := newResult(2, "1 caller, median latency", "µs", 1650, 1400, "bare server", Target{Of: "figure", Op: "<=", Value: 1860})
	r2.Target.Text = "≤ bare + 1 commit (410 µs) + 50 µs"
	r4 := newResult(4, "dispatcher, concurrency 4", "effects/s", 11234.4, 23456.7, "bare http.Client", AtLeastRatio(0.5))
	r4.Note = "the fsync per commit"
	return &Report{
		Date:    "2026-12-02T10:00:00Z",
		Machine: Machine{CPUs: 2, CPU: "Some CPU", OS: "linux", Arch: "amd64", GoVersion: "go1.26"},
		Config:  quickConfig(),
		Results: []Result{r2, r4, newResult(6, "status lookup p99", "ms", 0.0456, 0.04, "1,000 calls", AtMost(1))},
	}
}

func TestReport_WriteTable(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := sampleReport().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"2 CPUs Some CPU, linux/amd64, go1.26; synchronous=FULL",
		"#  measurement",
		"1,650 µs", "1,400 µs (bare server)", "1.18×", "≤ bare + 1 commit (410 µs) + 50 µs",
		"11,234 effects/s", "23,457 effects/s (bare http.Client)", "0.48×", "≥ 0.5×",
		"0.05 ms", "≤ 1 ms",
		"\n4: the fsync per commit\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	lines := strings.Split(got, "\n")
	var rows []string
	for _, l := range lines {
		if len(l) > 0 && l[0] >= '1' && l[0] <= '7' && strings.Contains(l, "  ") {
			rows = append(rows, l)
		}
	}
	if len(rows) != 3 {
		t.Fatalf("%d result rows, want 3:\n%s", len(rows), got)
	}
	for i, want := range []string{"yes", "no", "yes"} {
		if f := strings.Fields(rows[i]); f[len(f)-1] != want {
			t.Errorf("row %d ends in %q, want %q: %s", i, f[len(f)-1], want, rows[i])
		}
	}
	// Columns line up (in runes: µ and × are two bytes): every row's ratio
	// starts where the header's does.
	col := strings.Index(lines[2], "ratio")
	for _, r := range rows {
		if rs := []rune(r); !strings.Contains(string(rs[col:col+6]), "×") {
			t.Errorf("ratio column not at %d in %q", col, r)
		}
	}
}

func TestReport_WriteJSON(t *testing.T) {
	t.Parallel()
	want := sampleReport()
	var b bytes.Buffer
	if err := want.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b.String())
	}
	if !reflect.DeepEqual(&got, want) {
		t.Errorf("round trip:\ngot  %+v\nwant %+v", got, *want)
	}
	var raw map[string]any
	if err := json.Unmarshal(b.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	r := raw["results"].([]any)[1].(map[string]any)
	for _, k := range []string{"id", "name", "unit", "figure", "baseline", "baselineName", "ratio", "target", "met", "note"} {
		if _, ok := r[k]; !ok {
			t.Errorf("result lacks field %q: %v", k, r)
		}
	}
}

func TestQuantity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{1234567.4, "1,234,567 u"}, {-4321, "-4,321 u"}, {999.6, "1000 u"}, {123.4, "123 u"},
		{12.34, "12.3 u"}, {0.456, "0.46 u"}, {0, "0.00 u"},
	} {
		if got := quantity(tc.v, "u"); got != tc.want {
			t.Errorf("quantity(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
