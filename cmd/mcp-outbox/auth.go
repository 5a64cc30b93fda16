package main

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
)

const authHelp = `Authentication (with --http):
  --tokens FILE holds one line per token, 'PRINCIPAL SHA256HEX', where
  SHA256HEX is the hex SHA-256 of the token (tokens are never stored in
  clear); blank lines and lines starting with # are ignored. MCP_OUTBOX_TOKENS
  adds 'principal=sha256hex,principal2=sha256hex'. 'mcp-outbox token new
  PRINCIPAL' makes a token and its line. With tokens, /mcp requires
  'Authorization: Bearer TOKEN' and scopes idempotency keys and call_status
  by principal. Without tokens (or OAuth), --http must be a loopback address, unless
  --insecure-no-auth is given.
  OAuth instead of static tokens: --oauth-issuer URL and --oauth-audience URL
  make /mcp an OAuth 2.1 resource server, as the MCP authorization spec
  wants. It accepts JWT access tokens signed by the issuer's keys (found
  through its /.well-known/oauth-authorization-server or
  openid-configuration document; https, or http on a loopback address),
  whose aud is exactly the --oauth-audience URL (the /mcp URL as clients
  reach it, such as https://mcp.example.com/mcp), valid now (30s skew).
  It publishes RFC 9728 metadata at
  /.well-known/oauth-protected-resource/mcp (and without /mcp), and
  answers a request without a valid token with 401 and 'WWW-Authenticate:
  Bearer resource_metadata="…"' (error="invalid_token" when a token came),
  and one without a scope it needs with 403 error="insufficient_scope".
  --oauth-scopes-required S,... are needed for every request;
  --oauth-tool-scope TOOL=S,... (repeatable) also for calls of TOOL,
  refused before anything of the call runs. With --oauth-client-id (and
  its secret), opaque tokens are asked about at the issuer's introspection
  endpoint (RFC 7662), the answer kept for 30s at most. The principal is
  'oauth:ISSUER#SUBJECT'. --tokens and --oauth-issuer cannot be combined:
  serve refuses to start rather than pick one.
  --admin-token-sha256 makes /admin require 'Authorization: Bearer TOKEN'
  from any address; without it /admin answers loopback clients only. The
  operator page at / follows the same rule; a browser logs in at /login
  with the admin token and gets a session cookie instead of the header.
  --operator-path /ops/ moves the page, /admin, /metrics, /healthz and
  /readyz under /ops/ (for a reverse proxy that routes by prefix). Session
  cookies are signed with the key in --operator-key-file, or else with a key
  kept in the database (table operator_secret, made on first start), so a
  login holds on every replica that shares the database.
  With --oauth-issuer, --oauth-operator-read-scope S and
  --oauth-operator-act-scope S2 also admit access tokens (issued for the
  --oauth-audience, in 'Authorization: Bearer') to /admin, /metrics and the
  page, from any address: S to read, S2 to act (and read). A token without
  the scope gets 403 error="insufficient_scope". The admin token still
  works, and the page's login form takes it only; the loopback rule is off
  (loopback clients need a token too: a proxy on this host would make
  every client look local). These scopes are not advertised in the /mcp
  metadata, so MCP clients do not ask for them.
`

// authConfig is serve's HTTP authentication: bearer tokens for /mcp, an
// admin token for /admin. The zero value authenticates nothing.
type authConfig struct {
	tokensFile     string
	adminHashHex   string
	insecureNoAuth bool

	operatorPath    string
	operatorKeyFile string

	oauthIssuer, oauthAudience, oauthScopes string
	oauthToolScopes                         toolScopes
	oauthClientID, oauthSecretFile          string
	oauthIntrospectionURL                   string
	oauthOpsRead, oauthOpsAct               string

	tokens     []bearer.Token
	oauth      *oauth.Options // with oauthIssuer; nil without
	rs         *oauth.ResourceServer
	adminHash  []byte
	sessionKey []byte // from operatorKeyFile; nil means the database's

	allowedOrigins []string // --allowed-origin (origin_flag.go)
}

func (c *authConfig) flags(env *environment, fs *flag.FlagSet) {
	fs.StringVar(&c.tokensFile, "tokens", env.envDefault("MCP_OUTBOX_TOKENS_FILE", ""),
		"with --http, require a bearer token on /mcp: `FILE` of 'PRINCIPAL SHA256HEX' lines; see Authentication above [MCP_OUTBOX_TOKENS_FILE, and MCP_OUTBOX_TOKENS=principal=sha256hex,...]")
	fs.StringVar(&c.adminHashHex, "admin-token-sha256", env.envDefault("MCP_OUTBOX_ADMIN_TOKEN_SHA256", ""),
		"with --http, require a bearer token whose SHA-256 is `HEX` on /admin, and accept it from any address [MCP_OUTBOX_ADMIN_TOKEN_SHA256]")
	fs.StringVar(&c.operatorPath, "operator-path", env.envDefault("MCP_OUTBOX_OPERATOR_PATH", "/"),
		"with --http, serve the operator page, /admin, /metrics, /healthz and /readyz under `PATH`, such as /ops/ [MCP_OUTBOX_OPERATOR_PATH]")
	fs.StringVar(&c.operatorKeyFile, "operator-key-file", env.envDefault("MCP_OUTBOX_OPERATOR_KEY_FILE", ""),
		"with --http, sign the operator page's sessions with the key in `FILE` (hex, at least 32 bytes; the same on every replica); "+
			"without it the key is kept in the database [MCP_OUTBOX_OPERATOR_KEY_FILE]")
	fs.StringVar(&c.oauthIssuer, "oauth-issuer", env.envDefault("MCP_OUTBOX_OAUTH_ISSUER", ""),
		"with --http, accept OAuth access tokens (JWT) from the authorization server `URL` on /mcp, instead of --tokens; see Authentication above [MCP_OUTBOX_OAUTH_ISSUER]")
	fs.StringVar(&c.oauthAudience, "oauth-audience", env.envDefault("MCP_OUTBOX_OAUTH_AUDIENCE", ""),
		"with --oauth-issuer, this resource's identifier: the /mcp `URL` as clients reach it; a token's aud must hold it exactly [MCP_OUTBOX_OAUTH_AUDIENCE]")
	fs.StringVar(&c.oauthScopes, "oauth-scopes-required", env.envDefault("MCP_OUTBOX_OAUTH_SCOPES_REQUIRED", ""),
		"with --oauth-issuer, scopes every request to /mcp needs, as `S1,S2` [MCP_OUTBOX_OAUTH_SCOPES_REQUIRED]")
	c.oauthToolScopes.env = env.envDefault("MCP_OUTBOX_OAUTH_TOOL_SCOPES", "")
	fs.Var(&c.oauthToolScopes, "oauth-tool-scope",
		"with --oauth-issuer, scopes a call of a tool needs, as `TOOL=S1,S2`; repeat for more tools [MCP_OUTBOX_OAUTH_TOOL_SCOPES=TOOL=S1,S2;TOOL2=S3]")
	fs.StringVar(&c.oauthClientID, "oauth-client-id", env.envDefault("MCP_OUTBOX_OAUTH_CLIENT_ID", ""),
		"with --oauth-issuer, also accept opaque access tokens by asking the issuer's introspection endpoint (RFC 7662) as the client `ID`; "+
			"its secret comes from --oauth-client-secret-file or MCP_OUTBOX_OAUTH_CLIENT_SECRET [MCP_OUTBOX_OAUTH_CLIENT_ID]")
	fs.StringVar(&c.oauthSecretFile, "oauth-client-secret-file", env.envDefault("MCP_OUTBOX_OAUTH_CLIENT_SECRET_FILE", ""),
		"with --oauth-client-id, the client's secret is in `FILE` [MCP_OUTBOX_OAUTH_CLIENT_SECRET_FILE]")
	fs.StringVar(&c.oauthIntrospectionURL, "oauth-introspection-url", env.envDefault("MCP_OUTBOX_OAUTH_INTROSPECTION_URL", ""),
		"with --oauth-client-id, the introspection endpoint `URL`; without it, the issuer's discovery document names it [MCP_OUTBOX_OAUTH_INTROSPECTION_URL]")
	fs.StringVar(&c.oauthOpsRead, "oauth-operator-read-scope", env.envDefault("MCP_OUTBOX_OAUTH_OPERATOR_READ_SCOPE", ""),
		"with --oauth-issuer, also admit access tokens with scope `S` to read the operator page, /admin and /metrics; needs --oauth-operator-act-scope [MCP_OUTBOX_OAUTH_OPERATOR_READ_SCOPE]")
	fs.StringVar(&c.oauthOpsAct, "oauth-operator-act-scope", env.envDefault("MCP_OUTBOX_OAUTH_OPERATOR_ACT_SCOPE", ""),
		"with --oauth-issuer, admit access tokens with scope `S` to act (retry, cancel, resolve, settle) and read on the operator page and /admin; may equal the read scope [MCP_OUTBOX_OAUTH_OPERATOR_ACT_SCOPE]")
	// No environment variable on purpose: turning authentication off should
	// be visible on the command line, not inherited.
	fs.BoolVar(&c.insecureNoAuth, "insecure-no-auth", false,
		"allow --http on a non-loopback address without tokens: anyone who can reach it can charge")
}

// load reads the tokens and checks them against the listen address. serve
// calls it before opening the database, so a mistake creates no file.
func (c *authConfig) load(env *environment, listen string) error {
	if c.tokensFile != "" {
		b, err := bearer.ReadFile(c.tokensFile)
		if err != nil {
			return usagef("--tokens: %v", err)
		}
		toks, err := bearer.ParseFile(b)
		if err != nil {
			return usagef("--tokens %s: %v", c.tokensFile, err)
		}
		c.tokens = append(c.tokens, toks...)
	}
	if v := env.getenv("MCP_OUTBOX_TOKENS"); v != "" {
		toks, err := bearer.ParseEnv(v)
		if err != nil {
			return usagef("MCP_OUTBOX_TOKENS: %v", err)
		}
		c.tokens = append(c.tokens, toks...)
	}
	if err := bearer.CheckDistinct(c.tokens); err != nil {
		return usageError{err}
	}
	if c.adminHashHex != "" {
		h, err := bearer.ParseHash(c.adminHashHex)
		if err != nil {
			return usagef("--admin-token-sha256: %v", err)
		}
		for _, t := range c.tokens {
			if bytes.Equal(t.Hash, h) {
				return usagef("--admin-token-sha256 is also the token of principal %s; use a separate admin token", t.Principal)
			}
		}
		c.adminHash = h
	}
	if err := c.loadOperator(); err != nil {
		return err
	}
	if err := c.loadOAuth(env); err != nil {
		return err
	}
	switch {
	case c.oauth != nil && len(c.tokens) > 0:
		return usagef("--oauth-issuer with static tokens (--tokens or MCP_OUTBOX_TOKENS) configured: choose one; " +
			"a token of one could otherwise name the principal of the other")
	case c.oauth != nil && c.insecureNoAuth:
		return usagef("--insecure-no-auth with --oauth-issuer: drop one of them")
	case c.oauth != nil:
		return nil
	case len(c.tokens) > 0 && c.insecureNoAuth:
		return usagef("--insecure-no-auth with tokens configured: drop one of them")
	case len(c.tokens) == 0 && !c.insecureNoAuth && !operate.LoopbackHost(listen):
		return usagef("--http %q is not a loopback address and no tokens are configured, so anyone who can reach it could charge: "+
			"configure --tokens (see 'mcp-outbox token --help') or --oauth-issuer, listen on 127.0.0.1, or pass --insecure-no-auth", listen)
	}
	return nil
}

// loadOperator checks --operator-path and reads --operator-key-file.
func (c *authConfig) loadOperator() error {
	p := c.operatorPath
	if p == "" {
		p = "/"
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	if p == "/mcp/" || strings.HasPrefix(p, "/mcp/") || strings.ContainsAny(p, "?#\\ {}*") || strings.Contains(p, "..") || strings.Contains(p, "//") {
		return usagef("--operator-path %q: want a path such as /ops/, not /mcp or below it", c.operatorPath)
	}
	c.operatorPath = p
	if c.operatorKeyFile == "" {
		return nil
	}
	b, err := os.ReadFile(c.operatorKeyFile)
	if err != nil {
		return usagef("--operator-key-file: %v", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < 32 {
		return usagef("--operator-key-file %s: want at least 64 hex digits (32 bytes), such as 'openssl rand -hex 32' prints", c.operatorKeyFile)
	}
	c.sessionKey = key
	return nil
}

// verifier checks /mcp's bearer tokens; nil when there are none.
func (c *authConfig) verifier() *bearer.Verifier {
	if c == nil || len(c.tokens) == 0 {
		return nil
	}
	return bearer.NewVerifier(c.tokens)
}

// warnInsecure is printed whatever the log level: an exposed,
// unauthenticated server should never start quietly.
func warnInsecure(w io.Writer, listen string) {
	fmt.Fprintf(w, "mcp-outbox: WARNING: --insecure-no-auth: serving %s WITHOUT AUTHENTICATION; "+
		"anyone who can reach it can call tools as one shared principal\n", listen)
}
