package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

const authHelp = `Authentication (with --http):
  --tokens FILE holds one line per token, 'PRINCIPAL SHA256HEX', where
  SHA256HEX is the hex SHA-256 of the token (tokens are never stored in
  clear); blank lines and lines starting with # are ignored. MCP_OUTBOX_TOKENS
  adds 'principal=sha256hex,principal2=sha256hex'. 'mcp-outbox token new
  PRINCIPAL' makes a token and its line. With tokens, /mcp requires
  'Authorization: Bearer TOKEN' and scopes idempotency keys and call_status
  by principal. Without tokens, --http must be a loopback address, unless
  --insecure-no-auth is given.
  --admin-token-sha256 makes /admin require 'Authorization: Bearer TOKEN'
  from any address; without it /admin answers loopback clients only. The
  operator page at / follows the same rule; a browser logs in at /login
  with the admin token and gets a session cookie instead of the header.
`

// principalPattern keeps principals to what the token file and
// MCP_OUTBOX_TOKENS can carry unambiguously (no spaces, '=' or ',') and what
// reads well in logs and in the calls table.
var principalPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$`)

// noExpiry stands in for "never": the SDK's middleware refuses a TokenInfo
// without an expiration, and these tokens live until removed from the file.
var noExpiry = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// maxTokensFile bounds the tokens file; a few thousand lines is already far
// more than a static token list should hold.
const maxTokensFile = 1 << 20

type principalToken struct {
	principal string
	hash      []byte // SHA-256 of the token
}

// authConfig is serve's HTTP authentication: bearer tokens for /mcp, an
// admin token for /admin. The zero value authenticates nothing.
type authConfig struct {
	tokensFile     string
	adminHashHex   string
	insecureNoAuth bool

	tokens    []principalToken
	adminHash []byte
}

func (c *authConfig) flags(env *environment, fs *flag.FlagSet) {
	fs.StringVar(&c.tokensFile, "tokens", env.envDefault("MCP_OUTBOX_TOKENS_FILE", ""),
		"with --http, require a bearer token on /mcp: `FILE` of 'PRINCIPAL SHA256HEX' lines; see below [MCP_OUTBOX_TOKENS_FILE, and MCP_OUTBOX_TOKENS=principal=sha256hex,...]")
	fs.StringVar(&c.adminHashHex, "admin-token-sha256", env.envDefault("MCP_OUTBOX_ADMIN_TOKEN_SHA256", ""),
		"with --http, require a bearer token whose SHA-256 is `HEX` on /admin, and accept it from any address [MCP_OUTBOX_ADMIN_TOKEN_SHA256]")
	// No environment variable on purpose: turning authentication off should
	// be visible on the command line, not inherited.
	fs.BoolVar(&c.insecureNoAuth, "insecure-no-auth", false,
		"allow --http on a non-loopback address without tokens: anyone who can reach it can charge")
}

// load reads the tokens and checks them against the listen address. serve
// calls it before opening the database, so a mistake creates no file.
func (c *authConfig) load(env *environment, listen string) error {
	if c.tokensFile != "" {
		b, err := readLimited(c.tokensFile, maxTokensFile)
		if err != nil {
			return usagef("--tokens: %v", err)
		}
		toks, err := parseTokensFile(b)
		if err != nil {
			return usagef("--tokens %s: %v", c.tokensFile, err)
		}
		c.tokens = append(c.tokens, toks...)
	}
	if v := env.getenv("MCP_OUTBOX_TOKENS"); v != "" {
		toks, err := parseTokensEnv(v)
		if err != nil {
			return usagef("MCP_OUTBOX_TOKENS: %v", err)
		}
		c.tokens = append(c.tokens, toks...)
	}
	if err := checkDistinctHashes(c.tokens); err != nil {
		return usageError{err}
	}
	if c.adminHashHex != "" {
		h, err := parseHash(c.adminHashHex)
		if err != nil {
			return usagef("--admin-token-sha256: %v", err)
		}
		for _, t := range c.tokens {
			if bytes.Equal(t.hash, h) {
				return usagef("--admin-token-sha256 is also the token of principal %s; use a separate admin token", t.principal)
			}
		}
		c.adminHash = h
	}
	switch {
	case len(c.tokens) > 0 && c.insecureNoAuth:
		return usagef("--insecure-no-auth with tokens configured: drop one of them")
	case len(c.tokens) == 0 && !c.insecureNoAuth && !isLoopbackHost(listen):
		return usagef("--http %q is not a loopback address and no tokens are configured, so anyone who can reach it could charge: "+
			"configure --tokens (see 'mcp-outbox token --help'), listen on 127.0.0.1, or pass --insecure-no-auth", listen)
	}
	return nil
}

func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}

func parseTokensFile(b []byte) ([]principalToken, error) {
	var out []principalToken
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, maxTokensFile)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want 'PRINCIPAL SHA256HEX', got %d fields", n, len(f))
		}
		t, err := newPrincipalToken(f[0], f[1])
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

func parseTokensEnv(v string) ([]principalToken, error) {
	var out []principalToken
	for i, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		p, h, ok := strings.Cut(entry, "=")
		if !ok {
			return nil, fmt.Errorf("entry %d: want principal=sha256hex", i+1)
		}
		t, err := newPrincipalToken(strings.TrimSpace(p), strings.TrimSpace(h))
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i+1, err)
		}
		out = append(out, t)
	}
	return out, nil
}

func newPrincipalToken(principal, hashHex string) (principalToken, error) {
	if !principalPattern.MatchString(principal) {
		return principalToken{}, fmt.Errorf("principal %q: want 1 to 128 letters, digits and ._@:- starting with a letter or digit", principal)
	}
	h, err := parseHash(hashHex)
	if err != nil {
		return principalToken{}, fmt.Errorf("principal %s: %w", principal, err)
	}
	return principalToken{principal: principal, hash: h}, nil
}

// parseHash never echoes its input: a token pasted where its hash belongs
// must not end up in a log.
func parseHash(s string) ([]byte, error) {
	h, err := hex.DecodeString(s)
	if err != nil || len(h) != sha256.Size {
		return nil, fmt.Errorf("want the token's SHA-256 as %d hex digits, not the token itself (make it with 'mcp-outbox token hash')", 2*sha256.Size)
	}
	return h, nil
}

// checkDistinctHashes refuses one token for two principals: which one a
// call belongs to would depend on the order of the lines.
func checkDistinctHashes(toks []principalToken) error {
	seen := map[string]string{}
	for _, t := range toks {
		if p, ok := seen[string(t.hash)]; ok && p != t.principal {
			return fmt.Errorf("principals %s and %s have the same token hash", p, t.principal)
		}
		seen[string(t.hash)] = t.principal
	}
	return nil
}

// enabled reports whether /mcp requires a token.
func (c *authConfig) enabled() bool { return c != nil && len(c.tokens) > 0 }

// verify is the SDK's TokenVerifier for /mcp. It compares against every
// configured hash, in constant time, so the answer's timing tells nothing
// about which entry (if any) came close.
func (c *authConfig) verify(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	sum := sha256.Sum256([]byte(token))
	principal := ""
	for _, t := range c.tokens {
		if subtle.ConstantTimeCompare(sum[:], t.hash) == 1 && principal == "" {
			principal = t.principal
		}
	}
	if principal == "" {
		return nil, auth.ErrInvalidToken
	}
	return &auth.TokenInfo{UserID: principal, Expiration: noExpiry}, nil
}

// protectMCP puts /mcp behind the bearer tokens, when there are any. The
// SDK answers 401 itself and hands the principal to the layer as
// TokenInfo.UserID, which scopes keys and call_status.
func (c *authConfig) protectMCP(h http.Handler) http.Handler {
	if !c.enabled() {
		return h
	}
	return auth.RequireBearerToken(c.verify, nil)(h)
}

// checkAdminToken reports whether r carries the admin token.
func (c *authConfig) checkAdminToken(r *http.Request) bool {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return false
	}
	return c.isAdminToken(token)
}

// isAdminToken reports whether token is the admin token, for the bearer
// header and the operator page's login form alike.
func (c *authConfig) isAdminToken(token string) bool {
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(sum[:], c.adminHash) == 1
}

// warnInsecure is printed whatever the log level: an exposed,
// unauthenticated server should never start quietly.
func warnInsecure(w io.Writer, listen string) {
	fmt.Fprintf(w, "mcp-outbox: WARNING: --insecure-no-auth: serving %s WITHOUT AUTHENTICATION; "+
		"anyone who can reach it can call tools as one shared principal\n", listen)
}

// principals counts the distinct principals, for the start-up message.
func (c *authConfig) principals() int {
	seen := map[string]bool{}
	for _, t := range c.tokens {
		seen[t.principal] = true
	}
	return len(seen)
}
