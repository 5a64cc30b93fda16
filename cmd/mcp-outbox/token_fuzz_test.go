package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// FuzzTokenHash checks 'mcp-outbox token hash': it prints the SHA-256 of
// the token on stdin (white space around it is not part of it) and nothing
// else but the fixed warning of a weak token, or refuses with one of its
// fixed texts and prints nothing, so the token never appears in what it
// says.
func FuzzTokenHash(f *testing.F) {
	for _, s := range []string{"test", "test\n", "  test\r\n", "", "\n", "two words", "tab\tinside", "\xef\xbb\xbftest", "\x00", strings.Repeat("t", 100)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		var stdout, stderr bytes.Buffer
		env := &environment{stdin: bytes.NewReader(stdin), stdout: &stdout, stderr: &stderr,
			getenv: func(string) string { return "" }, environ: func() []string { return nil }}
		err := runToken(context.Background(), env, []string{"hash"})
		token := strings.TrimSpace(string(stdin))
		printed := stdout.String() + stderr.String()
		if err != nil {
			// One of the fixed refusals, and nothing printed: a token of
			// words from a refusal ("token hash") is in its text, and is
			// not repeated for that.
			if (err != errNoToken && err != errTokenSpace && err != errTokenLarge) || printed != "" {
				t.Fatalf("token hash %q: refused with %v, printing %q; want one of the fixed refusals and nothing printed", stdin, err, printed)
			}
			return
		}
		sum := sha256.Sum256([]byte(token))
		// On stderr nothing, or the fixed warning of a weak token.
		wantErr := ""
		if weakToken(token) {
			wantErr = weakTokenWarning
		}
		if want := hex.EncodeToString(sum[:]) + "\n"; stdout.String() != want || stderr.String() != wantErr {
			t.Fatalf("token hash %q printed %q / %q, want %q / %q", stdin, stdout.String(), stderr.String(), want, wantErr)
		}
		// Accepted only what an Authorization header can carry.
		if token == "" || strings.ContainsFunc(token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			t.Fatalf("token hash accepted %q", token)
		}
	})
}
