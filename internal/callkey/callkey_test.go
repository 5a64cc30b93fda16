package callkey

import (
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{``, `{}`},
		{`null`, `{}`},
		{`{"b":2,"a":1}`, `{"a":1,"b":2}`},
		{` { "a" : [ 1 , {"d":1,"c":2} ] } `, `{"a":[1,{"c":2,"d":1}]}`},
		{`{"n":1.0}`, `{"n":1}`},
		{`{"n":1e2}`, `{"n":100}`},
		{`{"n":0.5}`, `{"n":0.5}`},
		{`{"s":"é\u00e9"}`, `{"s":"éé"}`},
	} {
		got, err := Canonical([]byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("Canonical(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	// dec.More is false before a ']' or '}', so a stray closer once
	// passed for the end of the value.
	for _, bad := range []string{`{`, `{"a":1} x`, `{"n":1e999}`, `{"a":1}]`, `{"a":1}}`, `[1]]`} {
		if _, err := Canonical([]byte(bad)); err == nil {
			t.Errorf("Canonical(%s): want an error", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, ok := range []string{"a", "order-123", strings.Repeat("x", MaxKeyBytes), "ключ", `"quoted"`} {
		if err := Validate(ok); err != nil {
			t.Errorf("Validate(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxKeyBytes+1), "a\nb", "tab\t", "\x7f", "\xff", "a\u0085"} {
		if err := Validate(bad); err == nil {
			t.Errorf("Validate(%q): want an error", bad)
		}
	}
}

func TestFingerprint(t *testing.T) {
	a := Fingerprint("local", "charge", []byte(`{"amount":1}`))
	if a != Fingerprint("local", "charge", []byte(`{"amount":1}`)) {
		t.Error("fingerprint is not deterministic")
	}
	for _, other := range []string{
		Fingerprint("user:x", "charge", []byte(`{"amount":1}`)),
		Fingerprint("local", "refund", []byte(`{"amount":1}`)),
		Fingerprint("local", "charge", []byte(`{"amount":2}`)),
		Fingerprint("localc", "harge", []byte(`{"amount":1}`)), // no ambiguity at the boundaries
	} {
		if other == a {
			t.Errorf("different calls share fingerprint %s", a)
		}
	}
	if err := Validate(a); err != nil {
		t.Errorf("a fingerprint is not a valid key: %v", err)
	}
}
