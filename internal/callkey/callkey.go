// Package callkey holds what the library and the status lookup must agree on
// about a call's key: which keys are acceptable, how arguments are made
// canonical, and how a fingerprint is derived for a call that carried no key.
package callkey

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxKeyBytes is the longest key accepted, as at Stripe.
const MaxKeyBytes = 255

// LocalPrincipal is the principal of every call that arrives without an
// authenticated user: stdio, and HTTP without authentication.
const LocalPrincipal = "local"

// Source names where a call's key came from.
type Source string

// Key sources, in the order they are looked for.
const (
	SourceMeta        Source = "meta"        // params._meta.idempotencyKey
	SourceParams      Source = "params"      // params.idempotencyKey (SEP-3182)
	SourceHeader      Source = "header"      // HTTP Idempotency-Key
	SourceArgument    Source = "argument"    // the tool's idempotency_key argument
	SourceFingerprint Source = "fingerprint" // derived from principal, tool and arguments
)

// ErrInvalidKey is wrapped by every error from Validate.
var ErrInvalidKey = errors.New("invalid idempotency key")

// Validate reports whether key is usable: non-empty, at most MaxKeyBytes,
// valid UTF-8 of printable characters (unicode.IsPrint: letters, marks,
// numbers, punctuation, symbols and the ASCII space).
func Validate(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	for i, r := range key {
		switch {
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidKey, r, i)
		case !unicode.IsPrint(r):
			// Spaces other than U+0020, zero-width and format characters,
			// line separators: a key an operator cannot tell from another
			// when reading or typing it.
			return fmt.Errorf("%w: %U at byte %d is not printable", ErrInvalidKey, r, i)
		}
	}
	return nil
}

// Canonical returns arguments as canonical JSON: object keys sorted, no
// insignificant whitespace, numbers in one form (integers exactly, as plain
// digits, however they are spelt; other numbers in Go's shortest float
// form). Absent or null arguments are "{}".
func Canonical(args json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(args)) == 0 {
		return []byte("{}"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical arguments: %w", err)
	}
	// Not dec.More, which is false before a stray ']' or '}': only the
	// end of the input ends the value.
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canonical arguments: trailing data")
	}
	if v == nil {
		return []byte("{}"), nil
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			buf.Write(kb)
			buf.WriteByte(':')
			if err := writeCanonical(buf, v[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case json.Number:
		n, err := canonicalNumber(string(v))
		if err != nil {
			return err
		}
		buf.WriteString(n)
	default: // string, bool, nil
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("canonical arguments: %w", err)
		}
		buf.Write(b)
	}
	return nil
}

// maxIntegerDigits bounds the integers written out digit by digit: every
// integer a float64 can hold has at most 309, and a short literal such as
// 1e999999 must not become a megabyte of zeros.
const maxIntegerDigits = 309

// canonicalNumber writes a JSON number in one form per value. An integer,
// however it is spelt (100, 100.0, 1e2), is written exactly as plain
// digits: amounts beyond 2^53 or int64 must not round, or two calls with
// different amounts would get one arguments hash. Other numbers round to
// the nearest float64, as every JSON decoder reads them, in Go's shortest
// form.
func canonicalNumber(lit string) (string, error) {
	if i, err := strconv.ParseInt(lit, 10, 64); err == nil {
		return strconv.FormatInt(i, 10), nil
	}
	if digits, ok := exactInteger(lit); ok {
		return digits, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return "", fmt.Errorf("canonical arguments: number %s out of range", lit)
	}
	switch {
	case f == 0:
		return "0", nil // also -0
	case f == math.Trunc(f):
		// A fraction that rounded to an integer: plain digits, as the
		// integer itself would be written.
		return strconv.FormatFloat(f, 'f', -1, 64), nil
	}
	return strconv.FormatFloat(f, 'g', -1, 64), nil
}

// exactInteger returns the digits of a JSON number literal whose value is
// an integer of at most maxIntegerDigits digits, with its sign.
func exactInteger(lit string) (string, bool) {
	neg := strings.HasPrefix(lit, "-")
	mant, exp := strings.TrimPrefix(lit, "-"), 0
	if i := strings.IndexAny(mant, "eE"); i >= 0 {
		e, err := strconv.Atoi(mant[i+1:])
		if err != nil {
			return "", false // a huge exponent: out of range, or a fraction
		}
		mant, exp = mant[:i], e
	}
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		exp -= len(mant) - i - 1
		mant = mant[:i] + mant[i+1:]
	}
	mant = strings.TrimLeft(mant, "0")
	for strings.HasSuffix(mant, "0") {
		mant = mant[:len(mant)-1]
		exp++
	}
	switch {
	case mant == "":
		return "0", true
	case exp < 0 || len(mant)+exp > maxIntegerDigits:
		return "", false
	}
	if neg {
		return "-" + mant + strings.Repeat("0", exp), true
	}
	return mant + strings.Repeat("0", exp), true
}

// ArgsHash is the hex SHA-256 of the canonical arguments. Two calls with one
// key and different hashes are a conflict.
func ArgsHash(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// Fingerprint derives the key of a call that carried none: SHA-256 over the
// principal, the tool name and the canonical arguments, each length-prefixed
// so that no two different triples share an input.
func Fingerprint(principal, tool string, canonical []byte) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(principal), []byte(tool), canonical} {
		var n [8]byte
		for i := range n {
			n[i] = byte(uint64(len(part)) >> (8 * (7 - i)))
		}
		h.Write(n[:])
		h.Write(part)
	}
	return "fp_" + hex.EncodeToString(h.Sum(nil))
}
