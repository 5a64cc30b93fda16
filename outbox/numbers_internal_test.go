package outbox

import (
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
)

// survivesOracle decides survivesFloat64 the slow, obvious way: the exact
// rational value of the literal against that of the float64's shortest
// form.
func survivesOracle(t *testing.T, lit string) bool {
	t.Helper()
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return false
	}
	a, ok := new(big.Rat).SetString(lit)
	if !ok {
		t.Fatalf("big.Rat cannot read %q", lit)
	}
	b, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	return a.Cmp(b) == 0
}

func TestSurvivesFloat64(t *testing.T) {
	t.Parallel()
	for _, lit := range []string{
		"0", "-0", "0.0", "-0.0", "1", "1.0", "1e0", "10E-1", "0.1", "0.5", "123456789012345", "999999999999999",
		"9007199254740991", "9007199254740992", "9007199254740993", "-9007199254740993", "18014398509481984",
		"0.30000000000000004", "0.1000000000000000055511151231257827", "0.10000000000000000001",
		"1e21", "1e22", "1e23", "5e-324", "2e-324", "1e-400", "1.7976931348623157e308", "1.7976931348623159e308",
		"4.9406564584124654e-324", "2.2250738585072014e-308", "1e308", "123.456e2", "0.000001", "1e-7",
	} {
		if got, want := survivesFloat64([]byte(lit)), survivesOracle(t, lit); got != want {
			t.Errorf("survivesFloat64(%s) = %v, want %v", lit, got, want)
		}
	}
	// Random literals: digits, a decimal point somewhere, an exponent.
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var b strings.Builder
		if r.IntN(2) == 0 {
			b.WriteByte('-')
		}
		n := 1 + r.IntN(22)
		point := r.IntN(n + 1)
		for i := range n {
			if i == point && i > 0 {
				b.WriteByte('.')
			}
			d := byte('0' + r.IntN(10))
			if i == 0 && point != 1 {
				d = byte('1' + r.IntN(9)) // JSON has no leading zeros
			}
			b.WriteByte(d)
		}
		if r.IntN(3) == 0 {
			b.WriteString("e" + strconv.Itoa(r.IntN(700)-350))
		}
		lit := b.String()
		if got, want := survivesFloat64([]byte(lit)), survivesOracle(t, lit); got != want {
			t.Fatalf("survivesFloat64(%s) = %v, want %v", lit, got, want)
		}
	}
}

func TestArgumentPath(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ json, at, want string }{
		{`{"amount":7}`, "7", "/amount"},
		{`{"a":{"b":[1,2,{"c":7}]}}`, "7", "/a/b/2/c"},
		{`{"a\"b":1,"x/y~":[[0],[1,7]]}`, "7", "/x~1y~0/1/1"},
		{`{"s":"}]\\","k":[7]}`, "7", "/k/0"},
		{`{"a":[],"b":{},"c":7}`, "7", "/c"},
		{`7`, "7", ""},
	} {
		if got := argumentPath([]byte(c.json), strings.LastIndex(c.json, c.at)); got != c.want {
			t.Errorf("argumentPath(%s) = %q, want %q", c.json, got, c.want)
		}
	}
}

// BenchmarkCheckNumbers is what the check costs every call of a tool of
// the layer: a typical charge, and 1 KiB of mixed arguments. The canonical
// sub-benchmarks are the decode a recorded call already pays, to compare.
func BenchmarkCheckNumbers(b *testing.B) {
	for _, c := range []struct{ name, args string }{
		{"charge", `{"amount":100,"currency":"usd"}`},
		{"1KiB", `{"customer":"` + strings.Repeat("x", 600) + `","lines":[` +
			strings.TrimSuffix(strings.Repeat(`{"sku":"A-1","qty":3,"price":19.99},`, 10), ",") + `],"note":"\"quoted\""}`},
	} {
		args := []byte(c.args)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(args)))
			for b.Loop() {
				if res := checkNumbers(args); res != nil {
					b.Fatal("refused")
				}
			}
		})
		b.Run(c.name+"/canonical", func(b *testing.B) {
			b.SetBytes(int64(len(args)))
			for b.Loop() {
				if _, err := callkey.Canonical(args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
