package bearer

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/tokens"
)

// maxFileBytes bounds a tokens file; a few thousand lines is already far
// more than a static token list should hold.
const maxFileBytes = 1 << 20

// A Token is one principal's bearer token, known only by its hash.
type Token struct {
	Principal string
	Hash      []byte // SHA-256 of the token
}

// ReadFile reads a tokens file of at most 1 MiB, for ParseFile.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > maxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxFileBytes)
	}
	return b, nil
}

// LoadFile reads and parses the tokens file at path.
func LoadFile(path string) ([]Token, error) {
	b, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	toks, err := ParseFile(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return toks, nil
}

// ParseFile reads a tokens file: one 'PRINCIPAL SHA256HEX' line per token;
// blank lines and lines starting with # are ignored. An error names the
// line and never repeats its hash field, which may be a token pasted where
// its hash belongs.
func ParseFile(b []byte) ([]Token, error) {
	var out []Token
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, maxFileBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want 'PRINCIPAL SHA256HEX', got %d fields", n, len(f))
		}
		t, err := newToken(f[0], f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scan lines: %w", err)
	}
	return out, nil
}

// ParseEnv reads tokens from 'principal=sha256hex,principal2=sha256hex'
// (serve's MCP_OUTBOX_TOKENS).
func ParseEnv(v string) ([]Token, error) {
	var out []Token
	for i, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		p, h, ok := strings.Cut(entry, "=")
		if !ok {
			return nil, fmt.Errorf("entry %d: want principal=sha256hex", i+1)
		}
		t, err := newToken(strings.TrimSpace(p), strings.TrimSpace(h))
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i+1, err)
		}
		out = append(out, t)
	}
	return out, nil
}

func newToken(principal, hashHex string) (Token, error) {
	if !tokens.ValidPrincipal(principal) {
		return Token{}, fmt.Errorf("principal %q: %s", principal, tokens.PrincipalRule)
	}
	h, err := ParseHash(hashHex)
	if err != nil {
		return Token{}, fmt.Errorf("principal %s: %w", principal, err)
	}
	return Token{Principal: principal, Hash: h}, nil
}

// ParseHash reads a token's SHA-256 in hex. It never echoes its input: a
// token pasted where its hash belongs must not end up in a log.
func ParseHash(s string) ([]byte, error) {
	h, err := hex.DecodeString(s)
	if err != nil || len(h) != sha256.Size {
		return nil, fmt.Errorf("want the token's SHA-256 as %d hex digits, not the token itself (make it with 'mcp-outbox token hash')", 2*sha256.Size)
	}
	return h, nil
}

// CheckDistinct refuses one token for two principals: which one a call
// belongs to would depend on the order of the lines.
func CheckDistinct(toks []Token) error {
	seen := map[string]string{}
	for _, t := range toks {
		if p, ok := seen[string(t.Hash)]; ok && p != t.Principal {
			return fmt.Errorf("principals %s and %s have the same token hash", p, t.Principal)
		}
		seen[string(t.Hash)] = t.Principal
	}
	return nil
}
