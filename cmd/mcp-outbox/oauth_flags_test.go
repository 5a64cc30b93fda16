package main

import (
	"flag"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestOAuthFlags: the --oauth-* flags and their variables, and the
// combinations serve refuses before it opens anything.
func TestOAuthFlags(t *testing.T) {
	t.Parallel()
	const iss, aud = "https://idp.example.com/realms/x", "https://mcp.example.com/mcp"
	hash := sha256Hex("alice-token")
	load := func(vars map[string]string, args ...string) (*authConfig, error) {
		env := testEnv(vars, nil, io.Discard, io.Discard)
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var ac authConfig
		ac.flags(env, fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &ac, ac.load(env, "0.0.0.0:8080")
	}

	t.Run("Flags", func(t *testing.T) {
		ac, err := load(nil, "--oauth-issuer", iss, "--oauth-audience", aud, "--oauth-scopes-required", "mcp, mcp:call",
			"--oauth-tool-scope", "charge=payments:write", "--oauth-tool-scope", "refund=payments:write,payments:refund")
		if err != nil {
			t.Fatal(err)
		}
		if got := ac.oauth.ScopesRequired; !slices.Equal(got, []string{"mcp", "mcp:call"}) {
			t.Errorf("scopes required %q", got)
		}
		if got := ac.oauth.ToolScopes["refund"]; !slices.Equal(got, []string{"payments:write", "payments:refund"}) {
			t.Errorf("refund's scopes %q", got)
		}
		rs := ac.resourceServer(slog.New(slog.DiscardHandler))
		if rs.MetadataURL() != "https://mcp.example.com/.well-known/oauth-protected-resource/mcp" {
			t.Errorf("metadata URL %s", rs.MetadataURL())
		}
	})

	t.Run("OperatorScopes", func(t *testing.T) {
		ac, err := load(map[string]string{"MCP_OUTBOX_OAUTH_OPERATOR_READ_SCOPE": "ops:read", "MCP_OUTBOX_OAUTH_OPERATOR_ACT_SCOPE": "ops:act"},
			"--oauth-issuer", iss, "--oauth-audience", aud)
		if err != nil {
			t.Fatal(err)
		}
		o := ac.operatorOAuth(slog.New(slog.DiscardHandler))
		if o == nil || o.ReadScope != "ops:read" || o.ActScope != "ops:act" || o.Verify == nil || o.ResourceMetadataURL == "" {
			t.Fatalf("operator OAuth %+v", o)
		}
		// The metadata is /mcp's: MCP clients ask for what it lists, and
		// must not be led to ask for the operator's scopes.
		if got := ac.resourceServer(slog.New(slog.DiscardHandler)).Metadata().ScopesSupported; slices.Contains(got, "ops:read") || slices.Contains(got, "ops:act") {
			t.Errorf("scopes_supported %q advertises the operator's scopes", got)
		}
	})

	t.Run("Environment", func(t *testing.T) {
		ac, err := load(map[string]string{
			"MCP_OUTBOX_OAUTH_ISSUER": iss, "MCP_OUTBOX_OAUTH_AUDIENCE": aud,
			"MCP_OUTBOX_OAUTH_SCOPES_REQUIRED": "mcp", "MCP_OUTBOX_OAUTH_TOOL_SCOPES": "charge=a,b; refund=c",
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := ac.oauth.ToolScopes; len(got) != 2 || !slices.Equal(got["charge"], []string{"a", "b"}) || !slices.Equal(got["refund"], []string{"c"}) {
			t.Errorf("tool scopes %q", got)
		}
	})

	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		want string
	}{
		{"WithStaticTokens", map[string]string{"MCP_OUTBOX_TOKENS": "alice=" + hash}, []string{"--oauth-issuer", iss, "--oauth-audience", aud}, "choose one"},
		{"WithInsecureNoAuth", nil, []string{"--oauth-issuer", iss, "--oauth-audience", aud, "--insecure-no-auth"}, "drop one"},
		{"NoAudience", nil, []string{"--oauth-issuer", iss}, "needs --oauth-audience"},
		{"AudienceAlone", nil, []string{"--oauth-audience", aud}, "need --oauth-issuer"},
		{"PlainHTTPIssuer", nil, []string{"--oauth-issuer", "http://idp.example.com", "--oauth-audience", aud}, "want https"},
		{"BadToolScope", nil, []string{"--oauth-issuer", iss, "--oauth-audience", aud, "--oauth-tool-scope", "charge"}, "TOOL=SCOPE"},
		{"ToolTwice", nil, []string{"--oauth-issuer", iss, "--oauth-audience", aud, "--oauth-tool-scope", "charge=a", "--oauth-tool-scope", "charge=b"}, "named twice"},
		{"OperatorReadAlone", nil, []string{"--oauth-issuer", iss, "--oauth-audience", aud, "--oauth-operator-read-scope", "ops:read"}, "go together"},
		{"OperatorScopeWithoutIssuer", map[string]string{"MCP_OUTBOX_OAUTH_OPERATOR_ACT_SCOPE": "ops"}, nil, "need --oauth-issuer"},
		{"OperatorTwoScopes", nil, []string{"--oauth-issuer", iss, "--oauth-audience", aud, "--oauth-operator-read-scope", "a,b", "--oauth-operator-act-scope", "c"}, "want one scope"},
		{"ScopeWithQuote", nil, []string{"--oauth-issuer", iss, "--oauth-audience", aud, "--oauth-scopes-required", `a"b`}, "printable ASCII"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(tc.vars, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("load = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestOAuthToolScopeUnknownTool: serve refuses a --oauth-tool-scope for a
// tool it does not offer, which would otherwise protect nothing, silently.
func TestOAuthToolScopeUnknownTool(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"MCP_OUTBOX_DB": filepath.Join(t.TempDir(), "ledger.db")}
	r := runCLI(t, vars, "serve", "--http", "127.0.0.1:0", "--oauth-issuer", "https://idp.example.com",
		"--oauth-audience", "https://mcp.example.com/mcp", "--oauth-tool-scope", "chrage=payments:write")
	if r.code != 2 || !strings.Contains(r.stderr, "--oauth-tool-scope: tool scopes name tools the server does not offer, so they protect nothing: chrage (its tools: ") {
		t.Errorf("exit %d, stderr %q; want exit 2 naming chrage and the tools", r.code, r.stderr)
	}
}
