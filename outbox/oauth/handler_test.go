package oauth_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
)

// endpoint is an MCP endpoint stand-in behind rs.Require, over real HTTP:
// it counts the requests that reach it and echoes the principal.
func endpoint(t *testing.T, rs *oauth.ResourceServer) (url string, reached *atomic.Int64) {
	t.Helper()
	reached = new(atomic.Int64)
	mux := http.NewServeMux()
	mux.Handle("/mcp", rs.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, auth.TokenInfoFromContext(r.Context()).UserID)
	})))
	for _, p := range rs.MetadataPaths() {
		mux.Handle(p, rs.MetadataHandler())
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, reached
}

type answer struct {
	status    int
	challenge string
	body      string
}

func post(t *testing.T, url, authorization, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)}
}

func TestRequire(t *testing.T) {
	t.Parallel()
	is := newIssuer(t)
	is.addKey("k1", jose.ES256, true)
	rs := newRS(t, is, &oauth.Options{
		ScopesRequired: []string{"mcp"},
		ToolScopes:     map[string][]string{"charge": {"payments:write"}, "refund": {"payments:write", "payments:refund"}},
	})
	base, reached := endpoint(t, rs)
	metaURL := resource[:strings.Index(resource, "/mcp")] + "/.well-known/oauth-protected-resource/mcp"
	if got := rs.MetadataURL(); got != metaURL {
		t.Fatalf("MetadataURL %q, want %q", got, metaURL)
	}
	withScope := func(scope string) string {
		c := is.good(resource)
		c.Scope = scope
		return is.mint("k1", c)
	}
	call := func(tool string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":{}}}`
	}
	expired := is.good(resource)
	expired.Expiry = expired.IssuedAt
	expiredTok := is.mint("k1", expired)

	for _, tc := range []struct {
		name, token, body string
		status            int
		challenge         string
	}{
		{"NoToken", "", call("charge"), 401, `Bearer resource_metadata="` + metaURL + `", scope="mcp"`},
		{"Expired", expiredTok, call("charge"), 401,
			`Bearer resource_metadata="` + metaURL + `", error="invalid_token", error_description="token expired", scope="mcp"`},
		{"Garbage", "not-a-jwt", call("charge"), 401,
			`Bearer resource_metadata="` + metaURL + `", error="invalid_token", error_description="malformed token", scope="mcp"`},
		{"NoRequiredScope", withScope("payments:write"), `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 403,
			`Bearer resource_metadata="` + metaURL + `", error="insufficient_scope", error_description="insufficient scope", scope="mcp"`},
		{"NoToolScope", withScope("mcp"), call("charge"), 403,
			`Bearer resource_metadata="` + metaURL + `", error="insufficient_scope", error_description="insufficient scope for the tool", scope="mcp payments:write"`},
		{"PartOfToolScopes", withScope("mcp payments:write"), call("refund"), 403,
			`Bearer resource_metadata="` + metaURL + `", error="insufficient_scope", error_description="insufficient scope for the tool", scope="mcp payments:refund payments:write"`},
		{"ToolScopeInABatch", withScope("mcp"), "[" + call("balance") + "," + call("charge") + "]", 403,
			`Bearer resource_metadata="` + metaURL + `", error="insufficient_scope", error_description="insufficient scope for the tool", scope="mcp payments:write"`},
		// The go-sdk reads "name" in exactly that case; a second spelling
		// must not hide the call from the check.
		{"ToolNameInAnotherCase", withScope("mcp"), `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","Name":"balance"}}`, 403,
			`Bearer resource_metadata="` + metaURL + `", error="insufficient_scope", error_description="insufficient scope for the tool", scope="mcp payments:write"`},
		{"UnnamedCall", withScope("mcp"), `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}}`, 403,
			`Bearer resource_metadata="` + metaURL + `", error="insufficient_scope", error_description="insufficient scope for the tool", scope="mcp payments:refund payments:write"`},
		// The go-sdk reads the first JSON value and ignores what follows
		// (FuzzToolsCalled found this one).
		{"TrailingData", withScope("mcp"), call("charge") + "0", 403,
			`Bearer resource_metadata="` + metaURL + `", error="insufficient_scope", error_description="insufficient scope for the tool", scope="mcp payments:write"`},
		{"ToolWithoutScopes", withScope("mcp"), call("balance"), 200, ""},
		{"ToolScope", withScope("mcp payments:write"), call("charge"), 200, ""},
		{"List", withScope("mcp"), `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := reached.Load()
			authz := ""
			if tc.token != "" {
				authz = "Bearer " + tc.token
			}
			a := post(t, base+"/mcp", authz, tc.body)
			if a.status != tc.status || a.challenge != tc.challenge {
				t.Fatalf("got %d %q, want %d %q (body %q)", a.status, a.challenge, tc.status, tc.challenge, a.body)
			}
			ran := reached.Load() - before
			switch {
			case tc.status == 200 && (ran != 1 || a.body != oauth.Principal(is.URL(), "client-1")):
				t.Errorf("accepted request: reached %d times, principal %q", ran, a.body)
			case tc.status != 200 && ran != 0:
				t.Errorf("refused request reached the endpoint")
			}
			if tc.token != "" && len(tc.token) > 8 && (strings.Contains(a.body, tc.token[:8]) || strings.Contains(a.challenge, tc.token[:8])) {
				t.Errorf("answer echoes the token: %q %q", a.challenge, a.body)
			}
		})
	}

	t.Run("BadHeader", func(t *testing.T) {
		a := post(t, base+"/mcp", "Bearer two tokens", call("charge"))
		if a.status != 400 || !strings.Contains(a.challenge, `error="invalid_request"`) || strings.Contains(a.body, "tokens") {
			t.Fatalf("got %+v, want 400 invalid_request", a)
		}
		// Another scheme is no bearer token at all (RFC 6750 §3.1: no
		// error code), and its credentials are not repeated.
		a = post(t, base+"/mcp", "Basic dXNlcjpwYXNz", call("charge"))
		if a.status != 401 || a.challenge != `Bearer resource_metadata="`+metaURL+`", scope="mcp"` || strings.Contains(a.body, "dXNlcjpwYXNz") {
			t.Fatalf("got %+v, want 401 with a bare challenge", a)
		}
	})

	t.Run("Metadata", func(t *testing.T) {
		for _, p := range []string{"/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"} {
			resp, err := http.Get(base + p)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			err = json.NewDecoder(resp.Body).Decode(&m)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("GET %s: %d %v", p, resp.StatusCode, err)
			}
			b, _ := json.Marshal(m)
			want := `{"authorization_servers":["` + is.URL() + `"],"bearer_methods_supported":["header"],"resource":"` + resource +
				`","scopes_supported":["mcp","payments:refund","payments:write"]}`
			if string(b) != want {
				t.Errorf("GET %s:\n got %s\nwant %s", p, b, want)
			}
		}
	})
}
