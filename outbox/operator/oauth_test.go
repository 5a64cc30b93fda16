package operator

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
)

// opsIssuer is an authorization server as a resource server sees one: a
// discovery document and a JWKS over real HTTP, with an ES256 key made
// here, and tokens minted with it.
type opsIssuer struct {
	t   *testing.T
	srv *httptest.Server
	key *ecdsa.PrivateKey
}

func newOpsIssuer(t *testing.T) *opsIssuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	is := &opsIssuer{t: t, key: key}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"issuer": is.srv.URL, "jwks_uri": is.srv.URL + "/jwks"})
	})
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	})
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	return is
}

// mint returns a token of subject for aud with scope, valid for ttl from
// a minute ago (negative: expired).
func (is *opsIssuer) mint(subject, aud, scope string, ttl time.Duration) string {
	is.t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: is.key},
		(&jose.SignerOptions{}).WithType("at+jwt").WithHeader(jose.HeaderKey("kid"), "k1"))
	if err != nil {
		is.t.Fatal(err)
	}
	now := time.Now()
	tok, err := jwt.Signed(sig).Claims(struct {
		jwt.Claims
		Scope string `json:"scope"`
	}{jwt.Claims{Issuer: is.srv.URL, Subject: subject, Audience: jwt.Audience{aud},
		IssuedAt: jwt.NewNumericDate(now.Add(-time.Minute)), Expiry: jwt.NewNumericDate(now.Add(ttl))}, scope}).Serialize()
	if err != nil {
		is.t.Fatal(err)
	}
	return tok
}

const opsResource = "https://mcp.example.com/mcp"

// opsRequest sends method path to h from a client that is not on this
// host, with token as bearer (none when empty) and form as body.
func opsRequest(h http.Handler, method, path, token string, form url.Values) *httptest.ResponseRecorder {
	var body *strings.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	} else {
		body = strings.NewReader("")
	}
	req := httptest.NewRequest(method, path, body)
	req.RemoteAddr, req.Host = "203.0.113.7:40000", "ops.example.com"
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestOperatorOAuthScopes: with Options.OAuth, an access token with the
// read scope reads the admin API, the metrics and the page, and only one
// with the act scope acts; each refusal answers the right status and
// challenge and changes nothing. The admin token still opens everything.
func TestOperatorOAuthScopes(t *testing.T) {
	t.Parallel()
	is := newOpsIssuer(t)
	rs, err := oauth.New(is.srv.URL, opsResource, nil)
	if err != nil {
		t.Fatal(err)
	}
	db := openTestDB(t)
	insertEffect(t, db, "payments", "dead")
	var logs lockedBuffer
	h, err := NewHandler(context.Background(), db, &Options{
		AdminTokenSHA256: adminHash(),
		Logger:           slog.New(slog.NewTextHandler(&logs, nil)),
		OAuth: &OAuth{Verify: rs.Verify, ReadScope: "ops:read", ActScope: "ops:act",
			ResourceMetadataURL: rs.MetadataURL()},
	})
	if err != nil {
		t.Fatal(err)
	}
	reader := is.mint("reader", opsResource, "mcp ops:read", 5*time.Minute)
	actor := is.mint("actor", opsResource, "ops:act", 5*time.Minute)
	mcpOnly := is.mint("agent", opsResource, "mcp", 5*time.Minute)
	expired := is.mint("reader", opsResource, "ops:read ops:act", -30*time.Minute)
	elsewhere := is.mint("reader", "https://other.example.com/mcp", "ops:read ops:act", 5*time.Minute)
	meta := `resource_metadata="` + rs.MetadataURL() + `"`

	effectState := func() string {
		t.Helper()
		var s string
		if err := db.Read.QueryRow(`SELECT state FROM effects WHERE id = 1`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		name, method, path, token string
		form                      url.Values
		status                    int
		challenge                 []string // substrings of WWW-Authenticate; nil: none
	}{
		{"NoToken", "GET", "/admin/summary", "", nil, 401, []string{`realm="mcp-outbox admin"`, meta, `scope="ops:read"`}},
		{"NoTokenAct", "POST", "/admin/effects/1/retry", "", nil, 401, []string{meta, `scope="ops:act"`}},
		{"Expired", "GET", "/admin/summary", expired, nil, 401, []string{`error="invalid_token"`, `error_description="token expired"`}},
		{"OtherAudience", "GET", "/admin/summary", elsewhere, nil, 401, []string{`error="invalid_token"`, "another resource"}},
		{"Garbage", "GET", "/admin/summary", "not-a-token", nil, 401, []string{`error="invalid_token"`}},
		{"NoOperatorScope", "GET", "/admin/summary", mcpOnly, nil, 403, []string{`error="insufficient_scope"`, `scope="ops:read"`}},
		{"ReadCannotAct", "POST", "/admin/effects/1/retry", reader, nil, 403, []string{`error="insufficient_scope"`, `scope="ops:act"`}},
		{"ReadCannotActOnPage", "POST", "/effects/1/retry", reader, url.Values{}, 403, []string{`scope="ops:act"`}},
		{"ReadCannotSettleOnPage", "POST", "/calls/1/resolve", reader, url.Values{"outcome": {"failed"}}, 403, []string{`scope="ops:act"`}},
		{"MetricsNoToken", "GET", "/metrics", "", nil, 401, []string{`scope="ops:read"`}},
		{"Read", "GET", "/admin/summary", reader, nil, 200, nil},
		{"ReadEffect", "GET", "/admin/effects/1", reader, nil, 200, nil},
		{"ReadMetrics", "GET", "/metrics", reader, nil, 200, nil},
		{"ReadPage", "GET", "/", reader, nil, 200, nil},
		{"ActReads", "GET", "/admin/summary", actor, nil, 200, nil},
		{"AdminToken", "GET", "/admin/summary", testAdminToken, nil, 200, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := opsRequest(h, c.method, c.path, c.token, c.form)
			got := rec.Header().Get("WWW-Authenticate")
			if rec.Code != c.status {
				t.Fatalf("%s %s: %d %q (%s), want %d", c.method, c.path, rec.Code, rec.Body.String(), got, c.status)
			}
			if c.challenge == nil && got != "" {
				t.Errorf("WWW-Authenticate %q, want none", got)
			}
			for _, want := range c.challenge {
				if !strings.Contains(got, want) {
					t.Errorf("WWW-Authenticate %q lacks %s", got, want)
				}
			}
			if c.token != "" && strings.Contains(rec.Body.String()+got, c.token) {
				t.Error("the answer repeats the token")
			}
			if s := effectState(); s != "dead" {
				t.Fatalf("effect is %s after a request that may not act", s)
			}
		})
	}

	// The page's GET without anything still sends a browser to its login.
	if rec := opsRequest(h, "GET", "/", "", nil); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/login" {
		t.Errorf("page without credentials: %d %s, want 303 to /login", rec.Code, rec.Header().Get("Location"))
	}
	// The act scope acts, on the API, and the log names who did it.
	if rec := opsRequest(h, "POST", "/admin/effects/1/retry", actor, nil); rec.Code != http.StatusOK {
		t.Fatalf("retry with the act scope: %d %s", rec.Code, rec.Body.String())
	}
	if s := effectState(); s != "pending" {
		t.Errorf("effect %s after retry, want pending", s)
	}
	if want := "by=oauth:" + is.srv.URL + "#actor"; !strings.Contains(logs.String(), want) {
		t.Errorf("the action's log does not name %s:\n%s", want, logs.String())
	}
	// And on the page (a form post from the page itself).
	rec := opsRequest(h, "POST", "/effects/1/cancel", actor, url.Values{})
	if rec.Code != http.StatusSeeOther || effectState() != "cancelled" {
		t.Errorf("cancel on the page with the act scope: %d, effect %s; want 303, cancelled", rec.Code, effectState())
	}
}

// TestOperatorOAuthLoopback: without an admin token, OAuth admits tokens
// from any host, and turns the loopback rule off: a proxy on this host
// would make every tokenless client look local. The health checks stay
// open.
func TestOperatorOAuthLoopback(t *testing.T) {
	t.Parallel()
	is := newOpsIssuer(t)
	rs, err := oauth.New(is.srv.URL, opsResource, nil)
	if err != nil {
		t.Fatal(err)
	}
	db := openTestDB(t)
	h, err := NewHandler(context.Background(), db, &Options{
		OAuth: &OAuth{Verify: rs.Verify, ReadScope: "ops", ActScope: "ops", ResourceMetadataURL: rs.MetadataURL()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := getJSON(t, h, "/admin/summary"); code != http.StatusUnauthorized || !strings.Contains(fmt.Sprint(body), "loopback clients need one too") {
		t.Errorf("loopback without a token: %d %v, want 401 saying why", code, body)
	}
	if rec := opsRequest(h, "GET", "/healthz", "", nil); rec.Code != http.StatusOK {
		t.Errorf("healthz: %d, want 200", rec.Code)
	}
	rec := opsRequest(h, "GET", "/admin/summary", "", nil)
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Header().Get("WWW-Authenticate"), `scope="ops"`) {
		t.Errorf("another host without a token: %d %q, want 401 with a challenge", rec.Code, rec.Header().Get("WWW-Authenticate"))
	}
	if rec := opsRequest(h, "GET", "/admin/summary", is.mint("op", opsResource, "ops", time.Minute), nil); rec.Code != http.StatusOK {
		t.Errorf("another host with a token: %d %s, want 200", rec.Code, rec.Body.String())
	}
	req := httptest.NewRequest("GET", "/admin/summary", nil)
	req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
	req.Header.Set("Authorization", "Bearer "+is.mint("op", opsResource, "ops", -time.Hour))
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	if rr.Code != http.StatusUnauthorized {
		t.Errorf("loopback with an expired token: %d, want 401", rr.Code)
	}
}

// TestOperatorOAuthOptions: an OAuth that could admit no one is refused
// where it is configured, not when an operator first needs it.
func TestOperatorOAuthOptions(t *testing.T) {
	t.Parallel()
	verify := (&oauth.ResourceServer{}).Verify
	for _, o := range []*OAuth{
		{ReadScope: "r", ActScope: "a"},
		{Verify: verify, ReadScope: "r"},
		{Verify: verify, ActScope: "a"},
		{Verify: verify, ReadScope: "r w", ActScope: "a"},
	} {
		if _, err := options(&Options{OAuth: o}); err == nil {
			t.Errorf("OAuth %+v accepted", *o)
		}
	}
}
