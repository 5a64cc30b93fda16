package bearer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/tokens"
)

const fuzzHash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" // SHA-256 of "test"

// FuzzTokensFile checks the --tokens file parser: an accepted file yields
// one token per line that is not blank or a comment, each with a valid
// principal and a 32-byte hash, which written back as a file parses the
// same and which verify maps to its principal; a refused file names the
// line, and no refusal repeats a line's second field, which may be a token
// pasted where its hash belongs.
func FuzzTokensFile(f *testing.F) {
	for _, s := range []string{
		"alice " + fuzzHash + "\n",
		"# tokens\n\nalice " + fuzzHash + "\r\nbob\t" + strings.ToUpper(fuzzHash) + "\n",
		"\xef\xbb\xbfalice " + fuzzHash + "\n",
		"alice " + fuzzHash,
		"alice",
		"alice " + fuzzHash + " extra\n",
		"alice sk_live_this_is_a_token_not_a_hash\n",
		"al ice " + fuzzHash + "\n",
		"-alice " + fuzzHash + "\n",
		"user:alice@example.test " + fuzzHash + "\n",
		strings.Repeat("a", 129) + " " + fuzzHash + "\n",
		"alice " + fuzzHash[:62] + "\n",
		"alice " + fuzzHash + "\nbob " + fuzzHash + "\n",
		"\x00 \x00\n",
		"   \n\t\n#\n",
		"",
		"\xff " + fuzzHash + "\n",
		"alice\v" + fuzzHash + "\n",
		"alice\u00a0" + fuzzHash + "\n",
		"alice " + fuzzHash + "\rbob " + fuzzHash + "\r",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, file []byte) {
		toks, err := ParseFile(file)
		if err != nil {
			msg := err.Error()
			if !strings.Contains(msg, "line ") && !strings.Contains(msg, "scan lines") {
				t.Fatalf("error %q names no line", msg)
			}
			// The line the error names: its second field is not repeated.
			var n int
			if _, err := fmt.Sscanf(msg, "line %d:", &n); err == nil && n >= 1 && n <= len(lines(file)) {
				f := strings.Fields(lines(file)[n-1])
				if len(f) >= 2 && len(scrubbed(f[1])) >= 8 && strings.Contains(withoutPrincipal(msg, f[0]), scrubbed(f[1])) {
					t.Fatalf("error %q repeats the second field of line %d", msg, n)
				}
			}
			return
		}
		var want int
		for _, line := range lines(file) {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				want++
			}
		}
		if len(toks) != want {
			t.Fatalf("%d tokens from %q, want one per line: %d", len(toks), file, want)
		}
		var back strings.Builder
		for _, tok := range toks {
			if !tokens.ValidPrincipal(tok.Principal) || len(tok.Hash) != sha256.Size {
				t.Fatalf("token %+v: bad principal or hash", tok)
			}
			fmt.Fprintf(&back, "%s %s\n", tok.Principal, hex.EncodeToString(tok.Hash))
		}
		again, err := ParseFile([]byte(back.String()))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(toks) {
			t.Fatalf("written back as %q: %v, %v; want %v", back.String(), again, err, toks)
		}
		checkVerify(t, toks)
	})
}

// FuzzTokensEnv checks MCP_OUTBOX_TOKENS as FuzzTokensFile checks the file:
// entries name their number, never repeat a hash field, and round-trip.
func FuzzTokensEnv(f *testing.F) {
	for _, s := range []string{
		"alice=" + fuzzHash,
		"alice=" + fuzzHash + ", bob = " + fuzzHash + ",",
		"alice",
		"alice=sk_live_secret_token_value",
		"=" + fuzzHash,
		"a=b=c",
		",,,",
		"alice=" + fuzzHash + ",alice=" + fuzzHash,
		"ali ce=" + fuzzHash,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		toks, err := ParseEnv(v)
		if err != nil {
			msg := err.Error()
			if !strings.Contains(msg, "entry ") {
				t.Fatalf("error %q names no entry", msg)
			}
			// The entry the error names: its hash field is not repeated.
			var n int
			if _, err := fmt.Sscanf(msg, "entry %d:", &n); err != nil || n < 1 || n > len(strings.Split(v, ",")) {
				t.Fatalf("error %q names no entry of %q", msg, v)
			}
			p, h, ok := strings.Cut(strings.TrimSpace(strings.Split(v, ",")[n-1]), "=")
			h = strings.TrimSpace(h)
			if ok && len(scrubbed(h)) >= 8 && strings.Contains(withoutPrincipal(msg, strings.TrimSpace(p)), scrubbed(h)) {
				t.Fatalf("error %q repeats the hash field of entry %d", msg, n)
			}
			return
		}
		var parts []string
		for _, tok := range toks {
			if !tokens.ValidPrincipal(tok.Principal) || len(tok.Hash) != sha256.Size {
				t.Fatalf("token %+v: bad principal or hash", tok)
			}
			parts = append(parts, tok.Principal+"="+hex.EncodeToString(tok.Hash))
		}
		again, err := ParseEnv(strings.Join(parts, ","))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(toks) {
			t.Fatalf("written back: %v, %v; want %v", again, err, toks)
		}
		checkVerify(t, toks)
	})
}

// lines splits a file as bufio.Scanner does (a final \r of a line is not
// part of it).
func lines(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, len(b)+1)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// checkVerify: when the set of tokens is consistent (load's check), the
// token whose hash is "test"'s maps to its principal, and no other token
// is accepted.
func checkVerify(t *testing.T, toks []Token) {
	t.Helper()
	if CheckDistinct(toks) != nil {
		return
	}
	c := NewVerifier(toks)
	want := ""
	for _, tok := range toks {
		if hex.EncodeToString(tok.Hash) == fuzzHash {
			want = tok.Principal
			break
		}
	}
	info, err := c.Verify(context.Background(), "test", nil)
	switch {
	case want == "" && err == nil:
		t.Fatalf("verify accepted a token no line has: %+v", info)
	case want != "" && (err != nil || info.UserID != want):
		t.Fatalf("verify(test) = %+v, %v; want principal %s", info, err, want)
	}
}

// withoutPrincipal is a refusal with the principal it names (plain or
// quoted) and the words of the fixed texts taken out, before a test looks
// for a secret in it; look with scrubbed of the secret too. Else the
// principal may contain the secret, or form it with what the message puts
// around it (a quoted "\x80" followed by zeros, or "0000000" followed by
// the message's colon), and a secret made of the message's own words
// ("principal", "starting") is found in every refusal.
func withoutPrincipal(msg, principal string) string {
	if principal != "" {
		msg = strings.NewReplacer(fmt.Sprintf("%q", principal), "\x00", principal, "\x00").Replace(msg)
	}
	return scrubbed(msg)
}

// scrubbed is s with the words of the parser's fixed texts taken out.
var scrubbed = func() func(string) string {
	_, hashErr := ParseHash("")
	words := strings.Fields(strings.Join([]string{tokens.PrincipalRule, hashErr.Error(),
		"line entry want 'PRINCIPAL SHA256HEX', got fields principal=sha256hex principal scan lines:"}, " "))
	slices.SortFunc(words, func(a, b string) int { return len(b) - len(a) }) // the longest words first
	var pairs []string
	for _, w := range words {
		pairs = append(pairs, w, "\x00")
	}
	return strings.NewReplacer(pairs...).Replace
}()
