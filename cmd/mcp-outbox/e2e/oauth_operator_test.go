package e2e

import (
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOAuthOperatorRealIssuer: serve with --oauth-operator-*-scope behind
// the real authorization server. A token with the read scope reads /admin,
// only one with the act scope acts, and the admin token still works.
func TestOAuthOperatorRealIssuer(t *testing.T) {
	t.Parallel()
	addr := freeLoopbackAddr(t)
	resource := "http://" + addr + "/mcp"
	issuer := startIssuerFor(t, []string{resource}, nil, "mcp ops:read ops:act", []map[string]string{
		{"client_id": "reader", "client_secret": oauthSecret1, "scope": "mcp ops:read"},
		{"client_id": "actor", "client_secret": oauthSecret2, "scope": "ops:act"},
	})
	const adminToken = "operator-admin-token-0123456789"
	// With an admin token the loopback rule is off, so the test (on this
	// host) is judged by its tokens alone.
	cmd := exec.Command(bin, "serve", "--db", filepath.Join(t.TempDir(), "ops.db"), "--http", addr, "--log-level", "warn",
		"--oauth-issuer", issuer, "--oauth-audience", resource, "--admin-token-sha256", sha256Hex(adminToken),
		"--oauth-operator-read-scope", "ops:read", "--oauth-operator-act-scope", "ops:act")
	if got := startHTTPCommand(t, cmd); got != resource {
		t.Fatalf("serving at %s, want %s", got, resource)
	}
	reader := issuerToken(t, issuer, "reader", oauthSecret1, resource, "ops:read")
	actor := issuerToken(t, issuer, "actor", oauthSecret2, resource, "ops:act")
	call := func(method, path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
	}
	for _, c := range []struct {
		method, path, token string
		status              int
		challenge           string
	}{
		{"GET", "/admin/summary", "", 401, `resource_metadata="http://` + addr + `/.well-known/oauth-protected-resource/mcp"`},
		{"GET", "/admin/summary", reader, 200, ""},
		{"GET", "/metrics", reader, 200, ""},
		{"GET", "/", reader, 200, ""},
		{"POST", "/admin/effects/retry-dead", reader, 403, `error="insufficient_scope", error_description="insufficient scope", scope="ops:act"`},
		{"POST", "/admin/effects/retry-dead", actor, 200, ""},
		{"POST", "/admin/effects/retry-dead", adminToken, 200, ""},
	} {
		status, challenge := call(c.method, c.path, c.token)
		if status != c.status || !strings.Contains(challenge, c.challenge) {
			t.Errorf("%s %s: %d %q, want %d with %s", c.method, c.path, status, challenge, c.status, c.challenge)
		}
	}
}
