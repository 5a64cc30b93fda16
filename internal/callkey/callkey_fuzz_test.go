package callkey

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// canonicalSeeds are arguments as clients send them, and the edge cases a
// canonical form has to survive: huge and odd numbers, deep nesting,
// invalid UTF-8, a BOM, CRLF, nulls and duplicate keys.
var canonicalSeeds = []string{
	``,
	`null`,
	`{}`,
	`{"amount":100,"currency":"eur"}`,
	"{\r\n  \"currency\": \"eur\",\r\n  \"amount\": 100\r\n}\r\n",
	`{"b":{"y":[1,2,{"q":null}],"x":true},"a":"z"}`,
	`{"n":1.0,"m":1e2,"o":-0,"p":-0.0,"q":0.5,"r":1E-7}`,
	`{"big":9007199254740993,"bigger":18446744073709551617,"huge":123456789012345678901234567890}`,
	`{"f":9007199254740993.0,"g":1e16,"h":10000000000000000}`,
	`{"x":1e308,"y":-1e308,"z":4.9e-324,"w":1e-400}`,
	`{"over":1e309}`,
	`{"a":1,"a":2}`,
	`{"s":"é\u00e9\ud83d\ude00","t":"<&>","u":"\u2028"}`,
	"{\"bad\":\"\xff\xfe\"}",
	"\xef\xbb\xbf{\"bom\":1}",
	`[1,"two",null,false]`,
	`"just a string"`,
	`42`,
	`{"a":1} {"b":2}`,
	`{"a":`,
	strings.Repeat(`[`, 100) + strings.Repeat(`]`, 100),
	strings.Repeat(`{"a":`, 50) + `1` + strings.Repeat(`}`, 50),
	`{"idempotency_key":"order-1","amount":1}`,
}

// FuzzCanonical checks what the key layer relies on: a canonical form is
// compact, valid JSON, canonical again unchanged, the same for any
// formatting or key order of the same value, and keeps every integer
// exactly (two charges of different amounts must never share an
// arguments hash). Valid JSON is refused only for a number out of range.
func FuzzCanonical(f *testing.F) {
	for _, s := range canonicalSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonical(in)
		if err != nil {
			if json.Valid(in) && !strings.Contains(err.Error(), "out of range") {
				t.Fatalf("Canonical(%q) refused valid JSON: %v", in, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("Canonical(%q) = %q, not valid JSON", in, out)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, out); err != nil || !bytes.Equal(compact.Bytes(), out) {
			t.Fatalf("Canonical(%q) = %q, not compact", in, out)
		}
		again, err := Canonical(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: Canonical(%q) = %q, then %q (%v)", in, out, again, err)
		}
		if len(bytes.TrimSpace(in)) == 0 {
			return
		}
		v := decodeNumbers(t, in)
		if v == nil {
			if string(out) != "{}" {
				t.Fatalf("Canonical(%q) = %q, want {} for null", in, out)
			}
			return
		}
		if !sameValue(v, decodeNumbers(t, out)) {
			t.Fatalf("Canonical(%q) = %q: not the same value", in, out)
		}
		// Any other spelling of the same value: keys reversed, indented.
		other := reversedJSON(v)
		if !json.Valid(other) {
			t.Fatalf("test bug: %q", other)
		}
		var indented bytes.Buffer
		if err := json.Indent(&indented, other, "\r\n", "\t"); err != nil {
			t.Fatal(err)
		}
		alt, err := Canonical(indented.Bytes())
		if err != nil || !bytes.Equal(alt, out) {
			t.Fatalf("Canonical(%q) = %q, but Canonical(%q) = %q (%v)", in, out, indented.Bytes(), alt, err)
		}
		fp := Fingerprint(LocalPrincipal, "charge", out)
		if fp != Fingerprint(LocalPrincipal, "charge", alt) || !fingerprintPattern.MatchString(fp) || Validate(fp) != nil {
			t.Fatalf("fingerprint %q of %q: unstable or not a valid key", fp, out)
		}
	})
}

var fingerprintPattern = regexp.MustCompile(`^fp_[0-9a-f]{64}$`)

// decodeNumbers decodes valid JSON the way Canonical reads it: duplicate
// keys keep the last value, numbers stay as written.
func decodeNumbers(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return v
}

// sameValue compares decoded JSON. An integer must come out exactly; other
// numbers may round to the nearest float64, as every JSON decoder does.
func sameValue(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok || !sameValue(va, vb) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameValue(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		return ok && sameNumber(string(a), string(b))
	case string:
		// Invalid UTF-8 is read as U+FFFD, by the decoder and by Canonical.
		b, ok := b.(string)
		return ok && a == b
	}
	return a == b
}

func sameNumber(a, b string) bool {
	ra, okA := smallRat(a)
	rb, okB := smallRat(b)
	if okA && okB && ra.IsInt() {
		return ra.Cmp(rb) == 0
	}
	fa, errA := parseFloat(a)
	fb, errB := parseFloat(b)
	return errA == nil && errB == nil && fa == fb
}

// smallRat is a number's exact value, unless its exponent is so large that
// the value would take more memory than a test should.
func smallRat(s string) (*big.Rat, bool) {
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		exp := strings.TrimLeft(s[i+1:], "+-")
		if len(exp) > 3 {
			return nil, false
		}
	}
	r, ok := new(big.Rat).SetString(s)
	return r, ok
}

func parseFloat(s string) (float64, error) {
	var f float64
	if err := json.Unmarshal([]byte(s), &f); err != nil {
		return 0, err
	}
	if math.IsInf(f, 0) {
		return 0, errors.New("infinite")
	}
	return f, nil
}

// reversedJSON writes v with object keys in reverse order and strings
// escaped differently from json.Marshal, to compare spellings of one value.
func reversedJSON(v any) []byte {
	var b bytes.Buffer
	var write func(any)
	write = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Sort(sort.Reverse(sort.StringSlice(keys)))
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteByte(',')
				}
				writeEscaped(&b, k)
				b.WriteByte(':')
				write(v[k])
			}
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					b.WriteByte(',')
				}
				write(e)
			}
			b.WriteByte(']')
		case string:
			writeEscaped(&b, v)
		case json.Number:
			// Another spelling of the same number: 100 as 100e0.
			b.WriteString(string(v))
			if !strings.ContainsAny(string(v), "eE") {
				b.WriteString("e0")
			}
		default:
			m, _ := json.Marshal(v)
			b.Write(m)
		}
	}
	write(v)
	return b.Bytes()
}

// writeEscaped writes s as a JSON string with every non-ASCII rune as a
// \u escape, which is another spelling of the same string.
func writeEscaped(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r >= 0x7f:
			for _, u := range utf16Units(r) {
				b.WriteString(`\u`)
				b.WriteString(strings.ToLower(hex4(u)))
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

func utf16Units(r rune) []uint16 {
	if r < 0x10000 {
		return []uint16{uint16(r)}
	}
	r -= 0x10000
	return []uint16{uint16(0xd800 + (r >> 10)), uint16(0xdc00 + (r & 0x3ff))}
}

func hex4(u uint16) string {
	const digits = "0123456789ABCDEF"
	return string([]byte{digits[u>>12], digits[u>>8&0xf], digits[u>>4&0xf], digits[u&0xf]})
}

// FuzzValidate checks the key rule: an accepted key is 1 to 255 bytes of
// printable UTF-8 (as unicode.IsPrint has it); every refusal wraps
// ErrInvalidKey and names what is wrong without repeating the key.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		"order-123", "", " ", strings.Repeat("k", MaxKeyBytes), strings.Repeat("k", MaxKeyBytes+1),
		strings.Repeat("é", 127) + "x", strings.Repeat("é", 128), "ключ", "a\nb", "tab\t", "\r\n", "\x00",
		"\x7f", "\u0085", "\u00a0", "\xff", "\xef\xbb\xbfbom", "\xed\xa0\xbd", "😀", "\u2028", `"quoted"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := Validate(key)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("Validate(%q) = %v, does not wrap ErrInvalidKey", key, err)
			}
			if len(key) >= 8 && strings.Contains(err.Error(), key) {
				t.Fatalf("Validate(%q) = %v: the error repeats the key", key, err)
			}
			return
		}
		if key == "" || len(key) > MaxKeyBytes || !utf8.ValidString(key) {
			t.Fatalf("Validate(%q) accepted a key that is empty, too long or not UTF-8", key)
		}
		for _, r := range key {
			if !unicode.IsPrint(r) {
				t.Fatalf("Validate(%q) accepted %U, which is not printable", key, r)
			}
		}
	})
}
