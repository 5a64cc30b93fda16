package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
)

// The authorization server of these tests is the npm oidc-provider
// (testdata/oidc-provider/issuer.mjs): a certified OpenID provider that
// issues JWT access tokens by client credentials, bound to a resource by
// RFC 8707 resource indicators, and starts in well under a second.

const (
	oauthSecret1  = "c1-secret-0123456789abcdefghijklmnopqrstuvwxyz"
	oauthSecret2  = "c2-secret-0123456789abcdefghijklmnopqrstuvwxyz"
	oauthSecretRS = "rs-secret-0123456789abcdefghijklmnopqrstuvwxyz"
)

// oidcProviderDir returns testdata/oidc-provider, or skips (fails under
// MCP_OUTBOX_REQUIRE_INTEROP=1) when it is not installed.
func oidcProviderDir(t *testing.T) string {
	t.Helper()
	const what = "OAuth with oidc-provider"
	skipShortInterop(t, what)
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "oidc-provider"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		skipInterop(t, what, "node is not in PATH")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "oidc-provider", "package.json")); err != nil {
		skipInterop(t, what, "testdata/oidc-provider/node_modules is missing: run `npm ci` in testdata/oidc-provider, or `make test`")
	}
	return dir
}

// startIssuer runs issuer.mjs for resources and returns its issuer URL.
// Client c1 may get scopes mcp and payments:write, c2 only mcp; client rs
// is the resource servers' own, for introspection. Tokens for the
// resources in opaque are opaque, the others' JWTs.
func startIssuer(t *testing.T, resources, opaque []string) string {
	t.Helper()
	return startIssuerFor(t, resources, opaque, "mcp payments:write", []map[string]string{
		{"client_id": "c1", "client_secret": oauthSecret1, "scope": "mcp payments:write"},
		{"client_id": "c2", "client_secret": oauthSecret2, "scope": "mcp"},
		{"client_id": "rs", "client_secret": oauthSecretRS},
	})
}

// startIssuerFor runs issuer.mjs offering scopes to clients.
func startIssuerFor(t *testing.T, resources, opaque []string, scopes string, clientList []map[string]string) string {
	t.Helper()
	dir := oidcProviderDir(t)
	clients, _ := json.Marshal(clientList)
	cmd := exec.Command("node", "issuer.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OIDC_RESOURCE="+strings.Join(resources, " "), "OIDC_OPAQUE="+strings.Join(opaque, " "), "OIDC_SCOPES="+scopes, "OIDC_CLIENTS="+string(clients))
	cmd.Stderr = testWriter{t}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	issuers := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var v struct{ Issuer string }
			if json.Unmarshal(sc.Bytes(), &v) == nil && v.Issuer != "" {
				issuers <- v.Issuer
			}
		}
	}()
	select {
	case iss := <-issuers:
		return iss
	case <-time.After(30 * time.Second):
		t.Fatal("issuer.mjs did not report its issuer")
		return ""
	}
}

// freeLoopbackAddrs returns n distinct 127.0.0.1 addresses no one listens
// on now: a resource's URL (the tokens' audience) must be known before
// serve starts. All are held open until all are found, so that one test's
// servers never get the same port.
func freeLoopbackAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

func freeLoopbackAddr(t *testing.T) string { return freeLoopbackAddrs(t, 1)[0] }

// issuerToken gets a token for client by client credentials, as any
// OAuth client would, for the tests that speak HTTP themselves.
func issuerToken(t *testing.T, issuer, client, secret, resource, scope string) string {
	t.Helper()
	form := url.Values{"grant_type": {"client_credentials"}, "resource": {resource}, "scope": {scope}}
	req, err := http.NewRequest(http.MethodPost, issuer+"/token", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(client, secret)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &tok) != nil || tok.AccessToken == "" {
		t.Fatalf("token for %s: %d %s", client, resp.StatusCode, b)
	}
	return tok.AccessToken
}

// TestOAuthRealIssuer: serve --oauth-issuer in front of a real
// authorization server. The official TypeScript SDK client, given only the
// server's URL and its client credentials, discovers the authorization
// server from the 401 and the metadata, gets a token and charges once
// over two connections (the second a retry, replayed). Against a server
// that requires scopes, a client that asks for them does the same, and a
// token without the tool's scope gets 403 insufficient_scope and leaves
// no trace.
func TestOAuthRealIssuer(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		testOAuthRealIssuer(t, filepath.Join(dir, "open.db"), filepath.Join(dir, "scoped.db"), filepath.Join(dir, "opaque.db"))
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		oidcProviderDir(t) // skip before starting a cluster for nothing
		testOAuthRealIssuer(t, pgtest.Database(t), pgtest.Database(t), pgtest.Database(t))
	})
}

type oauthSummary struct {
	Charges []struct {
		IsError  bool `json:"isError"`
		ChargeID any  `json:"chargeId"`
		Replayed bool `json:"replayed"`
	} `json:"charges"`
	TokenScope string `json:"tokenScope"`
	Requests   []struct {
		Method, URL, Challenge string
		Status                 int
	} `json:"requests"`
}

func testOAuthRealIssuer(t *testing.T, openDB, scopedDB, opaqueDB string) {
	tsDir := tsClientDir(t)
	addrs := freeLoopbackAddrs(t, 3)
	openAddr, scopedAddr, opaqueAddr := addrs[0], addrs[1], addrs[2]
	open, scoped, opaque := "http://"+openAddr+"/mcp", "http://"+scopedAddr+"/mcp", "http://"+opaqueAddr+"/mcp"
	issuer := startIssuer(t, []string{open, scoped, opaque}, []string{opaque})
	serve := func(db, addr, resource string, extra ...string) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"serve", "--db", db, "--http", addr, "--log-level", "warn",
			"--oauth-issuer", issuer, "--oauth-audience", resource}, extra...)...)
		cmd.Env = append(os.Environ(), "MCP_OUTBOX_OAUTH_CLIENT_SECRET="+oauthSecretRS)
		if got := startHTTPCommand(t, cmd); got != resource {
			t.Fatalf("serving at %s, want %s", got, resource)
		}
	}
	serve(openDB, openAddr, open)
	serve(scopedDB, scopedAddr, scoped, "--oauth-scopes-required", "mcp", "--oauth-tool-scope", "charge=payments:write")
	serve(opaqueDB, opaqueAddr, opaque, "--oauth-client-id", "rs")

	// clientCharges runs oauth.mjs and checks one charge, then its replay,
	// under the client's principal, and discovery the spec's way.
	clientCharges := func(t *testing.T, db, resource, key string, amount int, scope ...string) *oauthSummary {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		node := exec.CommandContext(ctx, "node", append([]string{"oauth.mjs", resource, "c1", oauthSecret1, key, fmt.Sprint(amount)}, scope...)...)
		node.Dir = tsDir
		var stdout bytes.Buffer
		node.Stdout, node.Stderr = &stdout, testWriter{t}
		if err := node.Run(); err != nil {
			t.Fatalf("node oauth.mjs: %v\n%s", err, stdout.String())
		}
		var out oauthSummary
		if err := json.Unmarshal([]byte(lastLine(stdout.String())), &out); err != nil {
			t.Fatalf("summary %q: %v", stdout.String(), err)
		}
		u, _ := url.Parse(resource)
		var trail []string
		for _, r := range out.Requests {
			ru, _ := url.Parse(r.URL)
			trail = append(trail, fmt.Sprintf("%s %s %d", r.Method, ru.Path, r.Status))
			if r.Status == 401 && !strings.HasPrefix(r.Challenge, `Bearer resource_metadata="http://`+u.Host+`/.well-known/oauth-protected-resource/mcp"`) {
				t.Errorf("401 challenge %q", r.Challenge)
			}
		}
		t.Logf("requests: %s", strings.Join(trail, ", "))
		joined := strings.Join(trail, "\n")
		for _, want := range []string{"POST /mcp 401", "GET /.well-known/oauth-protected-resource/mcp 200", "POST /token 200", "POST /mcp 200"} {
			if !strings.Contains(joined, want) {
				t.Errorf("no %q among the client's requests", want)
			}
		}
		c := out.Charges
		if len(c) != 2 || c[0].IsError || c[1].IsError || c[0].ChargeID == nil || fmt.Sprint(c[0].ChargeID) != fmt.Sprint(c[1].ChargeID) || c[0].Replayed || !c[1].Replayed {
			t.Fatalf("charges %+v, want one charge, then its replay", c)
		}
		ledger := openLedgerDB(t, db)
		if n := countRows(t, ledger, `SELECT count(*) FROM charges WHERE amount = $1`, amount); n != 1 {
			t.Errorf("%d charges of %d, want exactly 1", n, amount)
		}
		want := "user:oauth:" + issuer + "#c1"
		if n := countRows(t, ledger, `SELECT count(*) FROM calls WHERE principal = $1 AND key = $2`, want, key); n != 1 {
			t.Errorf("%d calls of principal %s, want 1", n, want)
		}
		return &out
	}

	t.Run("URLAndClientCredentialsOnly", func(t *testing.T) {
		clientCharges(t, openDB, open, "oauth-key-1", 4242)
	})

	t.Run("OpaqueTokensIntrospected", func(t *testing.T) {
		clientCharges(t, opaqueDB, opaque, "oauth-key-3", 4444)
	})

	t.Run("ScopedWithScope", func(t *testing.T) {
		out := clientCharges(t, scopedDB, scoped, "oauth-key-2", 4343, "mcp payments:write")
		if out.TokenScope != "mcp payments:write" {
			t.Errorf("token scope %q", out.TokenScope)
		}
	})

	t.Run("MissingToolScope", func(t *testing.T) {
		ledger := openLedgerDB(t, scopedDB)
		tok := issuerToken(t, issuer, "c2", oauthSecret2, scoped, "mcp")
		before := countRows(t, ledger, `SELECT count(*) FROM calls`)
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"amount":777},"_meta":{"idempotencyKey":"k-777"}}}`
		for _, version := range []string{"2026-07-28", "2025-11-25"} {
			req, _ := http.NewRequest(http.MethodPost, scoped, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Protocol-Version", version)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ch := resp.Header.Get("WWW-Authenticate")
			if resp.StatusCode != 403 || !strings.Contains(ch, `error="insufficient_scope"`) || !strings.Contains(ch, `scope="mcp payments:write"`) {
				t.Errorf("%s: %d %q %s, want 403 insufficient_scope", version, resp.StatusCode, ch, b)
			}
			if strings.Contains(string(b)+ch, tok[:20]) {
				t.Errorf("answer repeats the token")
			}
		}
		if n := countRows(t, ledger, `SELECT count(*) FROM calls`); n != before {
			t.Errorf("calls %d -> %d: a refused call left a claim", before, n)
		}
		if n := countRows(t, ledger, `SELECT count(*) FROM charges WHERE amount = 777`); n != 0 {
			t.Errorf("%d charges of 777, want none", n)
		}
	})

	t.Run("PrincipalsApart", func(t *testing.T) {
		// Two clients of one issuer use the same key: two principals, two
		// charges; each sees only its own call.
		tok1 := issuerToken(t, issuer, "c1", oauthSecret1, open, "mcp")
		tok2 := issuerToken(t, issuer, "c2", oauthSecret2, open, "mcp")
		ids := map[string]int64{}
		for _, c := range []struct{ name, tok string }{{"c1", tok1}, {"c2", tok2}} {
			cs := connectHTTP(t, open, "", bearerClient(t, c.tok))
			res := mustSucceed(t, cs, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 5151},
				Meta: mcp.Meta{"idempotencyKey": "shared-key"}})
			ids[c.name] = structuredChargeID(t, res)
			st := callStatus(t, cs, "shared-key")
			if st["state"] != "completed" {
				t.Errorf("%s: call_status %v", c.name, st)
			}
		}
		if ids["c1"] == ids["c2"] {
			t.Errorf("c1 and c2 got the same charge %d for one key: principals collide", ids["c1"])
		}
		if n := countRows(t, openLedgerDB(t, openDB), `SELECT count(*) FROM charges WHERE amount = 5151`); n != 2 {
			t.Errorf("%d charges of 5151, want 2 (one per principal)", n)
		}

		// A session opened by c1 does not take c2's token.
		cs1 := connectHTTP(t, open, statefulVersion, bearerClient(t, tok1))
		req, _ := http.NewRequest(http.MethodPost, open, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"call_status","arguments":{"key":"shared-key"}}}`))
		req.Header.Set("Authorization", "Bearer "+tok2)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", statefulVersion)
		req.Header.Set("Mcp-Session-Id", cs1.ID())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || strings.Contains(string(b), "charge") {
			t.Errorf("c2's token on c1's session: %d %s, want 403", resp.StatusCode, b)
		}
	})

	t.Run("TokenForAnotherResource", func(t *testing.T) {
		// A real token of the same issuer, for the other server: its aud
		// is that server's URL, so this one refuses it.
		tok := issuerToken(t, issuer, "c1", oauthSecret1, open, "mcp payments:write")
		req, _ := http.NewRequest(http.MethodPost, scoped, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if ch := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != 401 || !strings.Contains(ch, `error="invalid_token", error_description="token issued for another resource"`) {
			t.Errorf("%d %q, want 401 invalid_token for another resource", resp.StatusCode, ch)
		}
	})
}

// TestOAuthProxyHTTP: proxy --http takes the same --oauth-* flags: its
// /mcp is a resource server of the real issuer, and the proxy records the
// upstream's calls under the token's principal.
func TestOAuthProxyHTTP(t *testing.T) {
	t.Parallel()
	tsUpstreamKind.check(t)
	addr := freeLoopbackAddr(t)
	resource := "http://" + addr + "/mcp"
	issuer := startIssuer(t, []string{resource}, nil)
	f := newProxyFixture(t, tsUpstreamKind)
	cmd := f.proxyCommand(t, bin, nil, "--cooperating", "--http", addr, "--oauth-issuer", issuer, "--oauth-audience", resource)
	if got := startHTTPCommand(t, cmd); got != resource {
		t.Fatalf("proxy serving at %s, want %s", got, resource)
	}
	if status := postInitialize(t, resource, ""); status != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", status)
	}
	resp, err := http.Get("http://" + addr + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
	}
	json.NewDecoder(resp.Body).Decode(&meta)
	resp.Body.Close()
	if meta.Resource != resource || len(meta.AuthorizationServers) != 1 || meta.AuthorizationServers[0] != issuer {
		t.Fatalf("metadata %+v", meta)
	}
	tok := issuerToken(t, issuer, "c1", oauthSecret1, resource, "mcp")
	cs := connectHTTP(t, resource, statefulVersion, bearerClient(t, tok))
	mustSucceed(t, cs, tsCharge("p-1", "ada", 100))
	wantReplay(t, mustSucceed(t, cs, tsCharge("p-1", "ada", 100)), true, "meta")
	if got := countRows(t, f.db, `SELECT count(*) FROM charges`); got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	want := "user:oauth:" + issuer + "#c1"
	if n := countRows(t, f.db, `SELECT count(*) FROM calls WHERE principal = $1 AND key = 'p-1'`, want); n != 1 {
		t.Errorf("%d calls of %s, want 1", n, want)
	}
}
