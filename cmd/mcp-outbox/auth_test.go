package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/tokens"
)

// newTokenFor runs `token new principal` and returns the token and the
// tokens-file line it printed.
func newTokenFor(t *testing.T, principal string) (token, line string) {
	t.Helper()
	r := runCLI(t, nil, "token", "new", principal)
	if r.code != 0 {
		t.Fatalf("token new %s: exit %d, %s", principal, r.code, r.stderr)
	}
	return strings.TrimSpace(r.stdout), r.stderr
}

// authServer runs serve's router, with the ledger and the layer, behind
// ac, on a loopback test server; it returns the /mcp URL.
func authServer(t *testing.T, ac *authConfig) string {
	t.Helper()
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	env := testEnv(nil, strings.NewReader(""), io.Discard, io.Discard)
	a, err := openApp(ctx, env, &appConfig{db: filepath.Join(t.TempDir(), "ledger.db"), durability: "full", logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	a.auth = ac
	srv := httptest.NewServer(testRouter(t, a, logger))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// loadAuth loads a tokens file holding lines, as serve does.
func loadAuth(t *testing.T, adminHash string, lines ...string) *authConfig {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	ac := &authConfig{tokensFile: path, adminHashHex: adminHash}
	if err := ac.load(testEnv(nil, nil, io.Discard, io.Discard), "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return ac
}

// TestAuthMCP: /mcp answers 401 without a token or with a wrong one, and
// each principal's keys and call_status are its own.
func TestAuthMCP(t *testing.T) {
	t.Parallel()
	aliceToken, aliceLine := newTokenFor(t, "alice")
	bobToken, bobLine := newTokenFor(t, "bob")
	url := authServer(t, loadAuth(t, "", "# team\n\n", aliceLine, bobLine))

	for _, tc := range []struct{ name, header string }{
		{"missing", ""},
		{"wrong", "Bearer " + aliceToken + "x"},
		{"hash instead of token", "Bearer " + sha256Hex(aliceToken)},
		{"not bearer", "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+aliceToken))},
	} {
		if status := postInitialize(t, url, tc.header); status != http.StatusUnauthorized {
			t.Errorf("%s token: status %d, want 401", tc.name, status)
		}
	}
	if status := postInitialize(t, url, "Bearer "+aliceToken); status != http.StatusOK {
		t.Errorf("right token: status %d, want 200", status)
	}

	alice := connectHTTP(t, url, statefulVersion, bearerClient(t, aliceToken))
	bob := connectHTTP(t, url, "", bearerClient(t, bobToken))
	wantTools(t, alice)

	// The same key and arguments from two principals are two calls.
	a := mustSucceed(t, alice, chargeCall("shared", 1000))
	b := mustSucceed(t, bob, chargeCall("shared", 1000))
	am, bm := wantReplay(t, a, false, "meta"), wantReplay(t, b, false, "meta")
	if am["callId"] == bm["callId"] || structuredChargeID(t, a) == structuredChargeID(t, b) {
		t.Errorf("alice and bob shared a call: %v / %v", am, bm)
	}
	// Each one's retry replays their own.
	if r := mustSucceed(t, bob, chargeCall("shared", 1000)); structuredChargeID(t, r) != structuredChargeID(t, b) {
		t.Errorf("bob's retry answered charge %d, want his %d", structuredChargeID(t, r), structuredChargeID(t, b))
	}
	if st := callStatus(t, alice, "shared"); st["callId"] != am["callId"] || st["state"] != "completed" {
		t.Errorf("alice's call_status shared = %v, want her call %v", st, am["callId"])
	}

	mustSucceed(t, alice, chargeCall("alice-only", 500))
	if st := callStatus(t, bob, "alice-only"); st["state"] != "not_found" {
		t.Errorf("bob sees alice's call: %v", st)
	}
	if st := callStatus(t, alice, "alice-only"); st["state"] != "completed" {
		t.Errorf("alice does not see her call: %v", st)
	}

	// A session belongs to its principal: bob's token on alice's session is
	// refused by the SDK.
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", alice.ID())
	req.Header.Set("Mcp-Protocol-Version", statefulVersion)
	resp, err := bearerClient(t, bobToken).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Errorf("bob used alice's session: status %d", resp.StatusCode)
	}
}

// TestAuthAdminToken: with an admin token, /admin wants it from every
// client, loopback or not, and no MCP token stands in for it.
func TestAuthAdminToken(t *testing.T) {
	t.Parallel()
	adminToken, _ := newTokenFor(t, "admin")
	aliceToken, aliceLine := newTokenFor(t, "alice")
	path, _ := newStatesDB(t)
	f := newAdminFixture(t, path)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := &app{db: f.db, server: mcp.NewServer(&mcp.Implementation{Name: "auth-test", Version: "v0"}, nil), logger: logger,
		auth: loadAuth(t, sha256Hex(adminToken), aliceLine)}
	f.router = testRouter(t, a, logger)

	authz := func(v string) func(*http.Request) { return func(r *http.Request) { r.Header.Set("Authorization", v) } }
	remote := func(r *http.Request) { r.RemoteAddr, r.Host = "192.0.2.7:40000", "ledger.example:8080" }
	crossSite := func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }
	for _, tc := range []struct {
		name   string
		mods   []func(*http.Request)
		status int
		want   string
	}{
		{"loopback without token", nil, 401, "admin token"},
		{"wrong token", []func(*http.Request){authz("Bearer nope")}, 401, "admin token"},
		{"MCP token", []func(*http.Request){authz("Bearer " + aliceToken)}, 401, "admin token"},
		{"hash as token", []func(*http.Request){authz("Bearer " + sha256Hex(adminToken))}, 401, "admin token"},
		{"remote without token", []func(*http.Request){remote}, 401, "admin token"},
		{"token from loopback", []func(*http.Request){authz("Bearer " + adminToken)}, 200, ""},
		{"token from afar", []func(*http.Request){remote, authz("bearer " + adminToken)}, 200, ""},
	} {
		status, m := f.do(t, http.MethodGet, "/admin/summary", "", tc.mods...)
		if tc.status == 200 {
			if status != 200 || m["total"] != 7.0 {
				t.Errorf("%s: %d %v, want the summary", tc.name, status, m)
			}
			continue
		}
		wantError(t, tc.name, status, m, tc.status, tc.want)
	}
	// The token does not excuse a cross-origin browser request (which
	// CrossOriginProtection judges on unsafe methods only).
	status, m := f.do(t, http.MethodPost, "/admin/effects/retry-dead", "", authz("Bearer "+adminToken), crossSite)
	wantError(t, "token, cross-site browser", status, m, http.StatusForbidden, "cross-origin")
	if status, m := f.do(t, http.MethodPost, "/admin/effects/retry-dead", "", remote, authz("Bearer "+adminToken)); status != 200 {
		t.Errorf("POST with token from afar: %d %v", status, m)
	}

	// Without an admin token, MCP tokens leave /admin loopback-only.
	g := newAdminFixture(t, path)
	b := &app{db: g.db, server: a.server, logger: logger, auth: loadAuth(t, "", aliceLine)}
	g.router = testRouter(t, b, logger)
	status, m = g.do(t, http.MethodGet, "/admin/summary", "", remote, authz("Bearer "+aliceToken))
	wantError(t, "remote with an MCP token, no admin token", status, m, http.StatusForbidden, "loopback")
	if status, m := g.do(t, http.MethodGet, "/admin/summary", ""); status != 200 {
		t.Errorf("loopback without admin token configured: %d %v", status, m)
	}
}

// TestAuthBadConfig: a malformed tokens setting, or a non-loopback --http
// without tokens, stops serve before the database file is created.
func TestAuthBadConfig(t *testing.T) {
	t.Parallel()
	_, aliceLine := newTokenFor(t, "alice")
	aliceHash := strings.Fields(aliceLine)[1]
	const cleartext = "c2VjcmV0LXRva2VuLXRoYXQtc2hvdWxkLW5vdC1sZWFr"
	const shortKey = "5eed5eed5eed5eed"
	shortKeyFile := filepath.Join(t.TempDir(), "operator-key")
	if err := os.WriteFile(shortKeyFile, []byte(shortKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		file  string // tokens file content; "" for no --tokens
		args  []string
		vars  map[string]string
		want  string
		wantN string // must not appear in stderr
	}{
		{"one field", "# ok\nalice " + aliceHash + "\nbob\n", nil, nil, "line 3: want 'PRINCIPAL SHA256HEX', got 1 fields", ""},
		{"three fields", "alice " + aliceHash + " extra\n", nil, nil, "line 1: want 'PRINCIPAL SHA256HEX', got 3 fields", ""},
		{"cleartext token", "\n\nalice " + cleartext + "\n", nil, nil, "line 3: principal alice: want the token's SHA-256 as 64 hex digits", cleartext},
		{"short hash", "alice " + aliceHash[:60] + "\n", nil, nil, "line 1: principal alice: want the token's SHA-256", ""},
		{"bad principal", "al=ice " + aliceHash + "\n", nil, nil, `line 1: principal "al=ice"`, ""},
		{"one token, two principals", "alice " + aliceHash + "\nbob " + strings.ToUpper(aliceHash) + "\n", nil, nil, "principals alice and bob have the same token hash", ""},
		{"missing file", "", []string{"--tokens", "/nonexistent/tokens"}, nil, "--tokens: open /nonexistent/tokens", ""},
		{"env entry", "", nil, map[string]string{"MCP_OUTBOX_TOKENS": "alice=" + aliceHash + ",bob"}, "MCP_OUTBOX_TOKENS: entry 2: want principal=sha256hex", ""},
		{"env hash", "", nil, map[string]string{"MCP_OUTBOX_TOKENS": "alice=" + cleartext}, "MCP_OUTBOX_TOKENS: entry 1: principal alice: want the token's SHA-256", cleartext},
		{"env file", "", nil, map[string]string{"MCP_OUTBOX_TOKENS_FILE": "/nonexistent/tokens"}, "--tokens: open /nonexistent/tokens", ""},
		{"admin hash", "", []string{"--admin-token-sha256", cleartext}, nil, "--admin-token-sha256: want the token's SHA-256", cleartext},
		{"admin hash env", "", nil, map[string]string{"MCP_OUTBOX_ADMIN_TOKEN_SHA256": "xyz"}, "--admin-token-sha256: want", ""},
		{"admin is alice", "alice " + aliceHash + "\n", []string{"--admin-token-sha256", aliceHash}, nil, "also the token of principal alice", ""},
		{"insecure with tokens", "alice " + aliceHash + "\n", []string{"--insecure-no-auth"}, nil, "--insecure-no-auth with tokens configured", ""},
		{"all interfaces", "", []string{"--http", "0.0.0.0:8080"}, nil, `--http "0.0.0.0:8080" is not a loopback address and no tokens are configured`, ""},
		{"empty host", "", []string{"--http", ":8080"}, nil, `--http ":8080" is not a loopback address`, ""},
		{"IPv6 any", "", []string{"--http", "[::]:8080"}, nil, `is not a loopback address`, ""},
		{"LAN address", "", []string{"--http", "192.168.1.10:8080"}, nil, `is not a loopback address`, ""},
		{"host name", "", []string{"--http", "ledger.example:8080"}, nil, `is not a loopback address`, ""},
		{"admin token alone", "", []string{"--http", "0.0.0.0:8080", "--admin-token-sha256", aliceHash}, nil, `is not a loopback address`, ""},
		{"operator path under /mcp", "", []string{"--operator-path", "/mcp/ops"}, nil, `--operator-path "/mcp/ops": want a path such as /ops/, not /mcp or below it`, ""},
		{"operator path query", "", []string{"--operator-path", "/ops?x=1"}, nil, `--operator-path "/ops?x=1": want a path such as /ops/`, ""},
		{"operator path env", "", nil, map[string]string{"MCP_OUTBOX_OPERATOR_PATH": "/a/../b"}, `--operator-path "/a/../b"`, ""},
		{"operator key missing", "", []string{"--operator-key-file", "/nonexistent/key"}, nil, "--operator-key-file: open /nonexistent/key", ""},
		{"operator key short", "", []string{"--operator-key-file", shortKeyFile}, nil, "want at least 64 hex digits (32 bytes)", shortKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			vars := map[string]string{"MCP_OUTBOX_DB": filepath.Join(dir, "ledger.db")}
			for k, v := range tc.vars {
				vars[k] = v
			}
			args := []string{"serve", "--http", "127.0.0.1:0"}
			if tc.file != "" {
				tokens := filepath.Join(t.TempDir(), "tokens")
				if err := os.WriteFile(tokens, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--tokens", tokens)
			}
			r := runCLI(t, vars, append(args, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", r.code, r.stderr, tc.want)
			}
			if tc.wantN != "" && strings.Contains(r.stderr, tc.wantN) {
				t.Errorf("the error repeats the secret: %q", r.stderr)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a rejected configuration left files: %v", entries)
			}
		})
	}
}

// watchWriter closes seen once what was written contains want.
type watchWriter struct {
	buf  syncBuffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *watchWriter) Write(p []byte) (int, error) {
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

// TestAuthInsecureNoAuth: --insecure-no-auth lets serve listen on every
// interface without tokens, and says so loudly.
func TestAuthInsecureNoAuth(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "ledger.db")
	seen := make(chan struct{})
	stderr := &watchWriter{want: "serving MCP at ", seen: seen}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- runEnv(ctx, testEnv(nil, strings.NewReader(""), io.Discard, stderr),
			[]string{"serve", "--db", dbPath, "--http", "0.0.0.0:0", "--insecure-no-auth", "--log-level", "error"})
	}()
	select {
	case <-seen:
	case code := <-done:
		t.Fatalf("serve exited %d before serving: %s", code, stderr.buf.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not start: %s", stderr.buf.String())
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("serve exited %d after cancel", code)
	}
	out := stderr.buf.String()
	for _, want := range []string{"WARNING: --insecure-no-auth", "WITHOUT AUTHENTICATION", "MCP authentication: no authentication"} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}
}

func TestTokenCommands(t *testing.T) {
	t.Parallel()
	var stdout, stderr syncBuffer
	code := runEnv(context.Background(), testEnv(nil, strings.NewReader("s3cret-token\n"), &stdout, &stderr), []string{"token", "hash"})
	if want := sha256Hex("s3cret-token") + "\n"; code != 0 || stdout.String() != want {
		t.Errorf("token hash: exit %d, stdout %q; want %q", code, stdout.String(), want)
	}
	if !strings.Contains(stderr.String(), "WARNING: this token is weak") || !strings.Contains(stderr.String(), "mcp-outbox token new") ||
		!strings.Contains(stderr.String(), "openssl rand -hex 32") {
		t.Errorf("token hash of a short token: stderr %q, want the warning of a weak token", stderr.String())
	}
	// Long but patterned: too little variety.
	for _, weak := range []string{strings.Repeat("a", 64), strings.Repeat("ab", 32), strings.Repeat("0123", 10)} {
		var stdout, stderr syncBuffer
		code := runEnv(context.Background(), testEnv(nil, strings.NewReader(weak), &stdout, &stderr), []string{"token", "hash"})
		if code != 0 || stdout.String() != sha256Hex(weak)+"\n" || !strings.Contains(stderr.String(), "WARNING: this token is weak") {
			t.Errorf("token hash of %q: exit %d, stdout %q, stderr %q; want the hash and the warning", weak, code, stdout.String(), stderr.String())
		}
	}
	// Strong ones, 'token new's and openssl's, never warn.
	for range 200 {
		tok, err := tokens.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		raw := make([]byte, 32)
		rand.Read(raw)
		for _, strong := range []string{tok, hex.EncodeToString(raw)} {
			var stdout, stderr syncBuffer
			code := runEnv(context.Background(), testEnv(nil, strings.NewReader(strong+"\n"), &stdout, &stderr), []string{"token", "hash"})
			if code != 0 || stderr.String() != "" {
				t.Fatalf("token hash of the strong %q: exit %d, stderr %q", strong, code, stderr.String())
			}
		}
	}

	token, line := newTokenFor(t, "alice")
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) != 32 {
		t.Errorf("token new: %q is not 32 bytes of base64url (%v)", token, err)
	}
	if want := "alice " + sha256Hex(token) + "\n"; line != want {
		t.Errorf("token new: stderr %q, want %q", line, want)
	}
	if other, _ := newTokenFor(t, "alice"); other == token {
		t.Errorf("token new gave the same token twice")
	}

	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"token"}, "", "want 'token new PRINCIPAL' or 'token hash'"},
		{[]string{"token", "new"}, "", "want one PRINCIPAL"},
		{[]string{"token", "new", "a b"}, "", `principal "a b"`},
		{[]string{"token", "hash", "s3cret"}, "", "takes no arguments"},
		{[]string{"token", "hash"}, "\n", "no token on stdin"},
		{[]string{"token", "hash"}, "two words\n", "white space"},
		{[]string{"token", "rotate"}, "", `unknown token command "rotate"`},
	} {
		var stdout, stderr syncBuffer
		code := runEnv(context.Background(), testEnv(nil, strings.NewReader(tc.stdin), &stdout, &stderr), tc.args)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) || stdout.String() != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
	r := runCLI(t, nil, "token", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "mcp-outbox token new PRINCIPAL") {
		t.Errorf("token --help: exit %d, %q", r.code, r.stdout)
	}
}

// TestOperatorConfig: --operator-path gains its slashes, and
// --operator-key-file's hex key reaches the operator surface.
func TestOperatorConfig(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("ab", 32)
	file := filepath.Join(t.TempDir(), "operator-key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &authConfig{operatorPath: "ops", operatorKeyFile: file}
	if err := c.loadOperator(); err != nil {
		t.Fatal(err)
	}
	if c.operatorBase() != "/ops/" || hex.EncodeToString(c.sessionKey) != key {
		t.Errorf("path %q, key %x; want /ops/ and %s", c.operatorBase(), c.sessionKey, key)
	}
	if (*authConfig)(nil).operatorBase() != "/" {
		t.Error("no configuration: want the operator surface at /")
	}
}
