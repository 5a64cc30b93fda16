package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
	"github.com/mcp-outbox/mcp-outbox/outbox/operator"
)

// loadOAuth checks the --oauth-* flags: all of them need --oauth-issuer,
// which needs --oauth-audience.
func (c *authConfig) loadOAuth(env *environment) error {
	tools, err := c.oauthToolScopes.parse()
	if err != nil {
		return usagef("--oauth-tool-scope: %v", err)
	}
	switch {
	case c.oauthIssuer == "" && (c.oauthAudience != "" || c.oauthScopes != "" || len(tools) > 0 || c.oauthClientID != "" ||
		c.oauthOpsRead != "" || c.oauthOpsAct != ""):
		return usagef("--oauth-audience, --oauth-scopes-required, --oauth-tool-scope, --oauth-client-id and --oauth-operator-*-scope need --oauth-issuer")
	case c.oauthIssuer == "":
		return nil
	case c.oauthAudience == "":
		return usagef("--oauth-issuer needs --oauth-audience: the /mcp URL as clients reach it, such as https://mcp.example.com/mcp")
	}
	if (c.oauthOpsRead == "") != (c.oauthOpsAct == "") {
		return usagef("--oauth-operator-read-scope and --oauth-operator-act-scope go together (they may be the same scope)")
	}
	for _, s := range []string{c.oauthOpsRead, c.oauthOpsAct} {
		// Checked here, as operator.Options would be, so that serve stops
		// before it opens the database.
		if strings.ContainsFunc(s, func(r rune) bool { return r < 0x21 || r > 0x7e || strings.ContainsRune(`,"\`, r) }) {
			return usagef("--oauth-operator-*-scope %q: want one scope, printable ASCII without spaces, commas, quotes or backslashes", s)
		}
	}
	opts := &oauth.Options{ScopesRequired: splitList(c.oauthScopes), ToolScopes: tools, ResourceName: "mcp-outbox"}
	if err := c.loadIntrospection(env, opts); err != nil {
		return err
	}
	if _, err := oauth.New(c.oauthIssuer, c.oauthAudience, opts); err != nil {
		return usagef("--oauth-issuer, --oauth-audience: %v", err)
	}
	c.oauth = opts
	return nil
}

// loadIntrospection reads --oauth-client-id and its secret: from a file
// or the environment, never the command line, where ps shows it.
func (c *authConfig) loadIntrospection(env *environment, opts *oauth.Options) error {
	secret := env.getenv("MCP_OUTBOX_OAUTH_CLIENT_SECRET")
	switch {
	case c.oauthClientID == "" && (c.oauthSecretFile != "" || c.oauthIntrospectionURL != ""):
		return usagef("--oauth-client-secret-file and --oauth-introspection-url need --oauth-client-id")
	case c.oauthClientID == "":
		return nil
	case c.oauthSecretFile != "":
		b, err := os.ReadFile(c.oauthSecretFile)
		if err != nil {
			return usagef("--oauth-client-secret-file: %v", err)
		}
		secret = strings.TrimSpace(string(b))
	}
	if secret == "" {
		return usagef("--oauth-client-id needs its secret: --oauth-client-secret-file FILE or MCP_OUTBOX_OAUTH_CLIENT_SECRET")
	}
	opts.Introspection = &oauth.Introspection{Endpoint: c.oauthIntrospectionURL, ClientID: c.oauthClientID, ClientSecret: secret}
	return nil
}

// resourceServer is /mcp's OAuth resource server; nil without
// --oauth-issuer. load checked the configuration.
func (c *authConfig) resourceServer(logger *slog.Logger) *oauth.ResourceServer {
	if c == nil || c.oauth == nil {
		return nil
	}
	if c.rs != nil {
		return c.rs // one key cache for the router and the start-up check
	}
	opts := *c.oauth
	opts.Logger = logger.With("subsystem", "oauth")
	rs, err := oauth.New(c.oauthIssuer, c.oauthAudience, &opts)
	if err != nil {
		panic(err) // load checked the same configuration
	}
	c.rs = rs
	return rs
}

// operatorOAuth is the operator surface's OAuth access; nil without
// --oauth-operator-read-scope.
func (c *authConfig) operatorOAuth(logger *slog.Logger) *operator.OAuth {
	rs := c.resourceServer(logger)
	if rs == nil || c.oauthOpsRead == "" {
		return nil
	}
	return &operator.OAuth{Verify: rs.Verify, ReadScope: c.oauthOpsRead, ActScope: c.oauthOpsAct, ResourceMetadataURL: rs.MetadataURL()}
}

// splitList reads 'a,b, c' as [a b c].
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// toolScopes is --oauth-tool-scope: repeated TOOL=S1,S2 flags, or else
// MCP_OUTBOX_OAUTH_TOOL_SCOPES's TOOL=S1,S2;TOOL2=S3.
type toolScopes struct {
	flags []string
	env   string
}

func (t *toolScopes) String() string {
	if t == nil {
		return ""
	}
	return strings.Join(t.flags, ";")
}

func (t *toolScopes) Set(v string) error {
	t.flags = append(t.flags, v)
	return nil
}

func (t *toolScopes) parse() (map[string][]string, error) {
	entries := t.flags
	if len(entries) == 0 {
		entries = strings.Split(t.env, ";")
	}
	out := map[string][]string{}
	for _, e := range entries {
		if strings.TrimSpace(e) == "" {
			continue
		}
		tool, scopes, ok := strings.Cut(e, "=")
		tool = strings.TrimSpace(tool)
		if !ok || tool == "" || len(splitList(scopes)) == 0 {
			return nil, fmt.Errorf("%q: want TOOL=SCOPE[,SCOPE...]", e)
		}
		if _, dup := out[tool]; dup {
			return nil, fmt.Errorf("tool %s named twice", tool)
		}
		out[tool] = splitList(scopes)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
