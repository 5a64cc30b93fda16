package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Result is one measurement, next to the baseline measured in the same run.
type Result struct {
	ID       int     `json:"id"` // the target's number in the issue
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Figure   float64 `json:"figure"`
	Baseline float64 `json:"baseline"`
	// BaselineName says what the baseline is.
	BaselineName string `json:"baselineName"`
	// Ratio is Figure / Baseline; 0 when the baseline is 0.
	Ratio  float64 `json:"ratio"`
	Target Target  `json:"target"`
	Met    bool    `json:"met"`
	// Note says what else was measured or why the target is not met.
	Note string `json:"note,omitempty"`
}

// Target is what a figure has to reach: its ratio to the baseline, or the
// figure itself, at most or at least Value.
type Target struct {
	Of    string  `json:"of"`    // "ratio" or "figure"
	Op    string  `json:"op"`    // "<=" or ">="
	Value float64 `json:"value"` // in the figure's unit when Of is "figure"
	// Text overrides the rendering, for targets stated another way.
	Text string `json:"text,omitempty"`
}

// AtLeastRatio, AtMostRatio and AtMost are the usual targets.
func AtLeastRatio(v float64) Target { return Target{Of: "ratio", Op: ">=", Value: v} }
func AtMostRatio(v float64) Target  { return Target{Of: "ratio", Op: "<=", Value: v} }
func AtMost(v float64) Target       { return Target{Of: "figure", Op: "<=", Value: v} }

// newResult fills in the ratio and whether the target is met.
func newResult(id int, name, unit string, figure, baseline float64, baselineName string, t Target) Result {
	r := Result{ID: id, Name: name, Unit: unit, Figure: figure, Baseline: baseline, BaselineName: baselineName, Target: t}
	if baseline != 0 {
		r.Ratio = figure / baseline
	}
	v := r.Figure
	if t.Of == "ratio" {
		v = r.Ratio
	}
	switch t.Op {
	case ">=":
		r.Met = v >= t.Value && !math.IsNaN(v)
	case "<=":
		r.Met = v <= t.Value && !math.IsNaN(v)
	}
	return r
}

func (t Target) String(unit string) string {
	if t.Text != "" {
		return t.Text
	}
	op := map[string]string{"<=": "≤", ">=": "≥"}[t.Op]
	if t.Of == "ratio" {
		return fmt.Sprintf("%s %s×", op, trim(t.Value, 2))
	}
	return fmt.Sprintf("%s %s %s", op, trim(t.Value, 2), unit)
}

// Report is a whole run.
type Report struct {
	Date    string   `json:"date"`
	Machine Machine  `json:"machine"`
	Config  Config   `json:"config"`
	Results []Result `json:"results"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPU       string `json:"cpu,omitempty"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	GoVersion string `json:"goVersion"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as an aligned table, then the notes.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "%s, %d CPUs %s, %s/%s, %s; synchronous=FULL\n\n",
		r.Date, r.Machine.CPUs, r.Machine.CPU, r.Machine.OS, r.Machine.Arch, r.Machine.GoVersion)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tmeasurement\tfigure\tbaseline\tratio\ttarget\tmet")
	for _, res := range r.Results {
		met := "no"
		if res.Met {
			met = "yes"
		}
		ratio := "-"
		if res.Baseline != 0 {
			ratio = trim(res.Ratio, 2) + "×"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s (%s)\t%s\t%s\t%s\n", res.ID, res.Name,
			quantity(res.Figure, res.Unit), quantity(res.Baseline, res.Unit), res.BaselineName,
			ratio, res.Target.String(res.Unit), met)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var notes []string
	for _, res := range r.Results {
		if res.Note != "" {
			notes = append(notes, fmt.Sprintf("%d: %s", res.ID, res.Note))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "\n%s\n", strings.Join(notes, "\n"))
	}
	return nil
}

// quantity renders a figure with its unit, with digit grouping for large
// numbers and three significant digits for small ones.
func quantity(v float64, unit string) string {
	var s string
	switch a := math.Abs(v); {
	case a >= 1000:
		s = group(int64(math.Round(v)))
	case a >= 100:
		s = strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	default:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	}
	return s + " " + unit
}

// trim formats v with at most prec decimals, dropping trailing zeros.
func trim(v float64, prec int) string {
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// group writes n with thousands separators: 1234567 -> "1,234,567".
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
