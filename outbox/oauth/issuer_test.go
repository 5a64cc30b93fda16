package oauth_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// testIssuer is an authorization server as far as a resource server sees
// one: a discovery document and a JWKS over real HTTP on 127.0.0.1, keys
// generated in the test, and tokens minted with them.
type testIssuer struct {
	t   testing.TB
	srv *httptest.Server

	mu           sync.Mutex
	keys         map[string]crypto.Signer // kid -> private key
	algs         map[string]jose.SignatureAlgorithm
	published    []string // kids in the JWKS
	cacheControl string

	jwksFetches atomic.Int64
	discovery   string // the well-known document served: "openid" or "oauth"
	// noIntrospection leaves introspection_endpoint out of the document.
	noIntrospection bool

	// Opaque tokens: what the introspection endpoint answers for each,
	// to the client rs/rs-secret only.
	opaque         map[string]map[string]any
	introspections atomic.Int64
}

func newIssuer(t testing.TB) *testIssuer {
	t.Helper()
	is := &testIssuer{t: t, keys: map[string]crypto.Signer{}, algs: map[string]jose.SignatureAlgorithm{}, discovery: "openid",
		opaque: map[string]map[string]any{}}
	mux := http.NewServeMux()
	doc := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		d := map[string]any{
			"issuer":                                is.URL(),
			"jwks_uri":                              is.URL() + "/jwks",
			"token_endpoint":                        is.URL() + "/token",
			"introspection_endpoint":                is.URL() + "/introspect",
			"id_token_signing_alg_values_supported": []string{"RS256"},
		}
		if is.noIntrospection {
			delete(d, "introspection_endpoint")
		}
		json.NewEncoder(w).Encode(d)
	}
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		if is.discovery != "openid" {
			http.NotFound(w, r)
			return
		}
		doc(w, r)
	})
	mux.HandleFunc("/.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		if is.discovery != "oauth" {
			http.NotFound(w, r)
			return
		}
		doc(w, r)
	})
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, r *http.Request) {
		is.jwksFetches.Add(1)
		is.mu.Lock()
		defer is.mu.Unlock()
		var set jose.JSONWebKeySet
		for _, kid := range is.published {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: is.keys[kid].Public(), KeyID: kid, Algorithm: string(is.algs[kid]), Use: "sig"})
		}
		w.Header().Set("Content-Type", "application/json")
		if is.cacheControl != "" {
			w.Header().Set("Cache-Control", is.cacheControl)
		}
		json.NewEncoder(w).Encode(set)
	})
	mux.HandleFunc("POST /introspect", func(w http.ResponseWriter, r *http.Request) {
		is.introspections.Add(1)
		if id, secret, ok := r.BasicAuth(); !ok || id != "rs" || secret != "rs-secret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="introspection"`)
			http.Error(w, `{"error":"invalid_client"}`, http.StatusUnauthorized)
			return
		}
		is.mu.Lock()
		answer, ok := is.opaque[r.PostFormValue("token")]
		is.mu.Unlock()
		if !ok {
			answer = map[string]any{"active": false}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(answer)
	})
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	return is
}

func (is *testIssuer) URL() string { return is.srv.URL }

// addKey makes a key of alg, published in the JWKS when publish.
func (is *testIssuer) addKey(kid string, alg jose.SignatureAlgorithm, publish bool) {
	is.t.Helper()
	var k crypto.Signer
	var err error
	switch alg {
	case jose.ES256:
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	}
	if err != nil {
		is.t.Fatal(err)
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys[kid], is.algs[kid] = k, alg
	if publish {
		is.published = append(is.published, kid)
	}
}

// publish replaces the JWKS's keys: a rotation.
func (is *testIssuer) publish(kids ...string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.published = kids
}

// claims are a token's claims; mint fills what is left zero.
type claims struct {
	jwt.Claims
	Scope string `json:"scope,omitempty"`
}

// mint signs c with key kid.
func (is *testIssuer) mint(kid string, c claims) string {
	is.t.Helper()
	is.mu.Lock()
	k, alg := is.keys[kid], is.algs[kid]
	is.mu.Unlock()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: k},
		(&jose.SignerOptions{}).WithType("at+jwt").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		is.t.Fatal(err)
	}
	tok, err := jwt.Signed(sig).Claims(c).Serialize()
	if err != nil {
		is.t.Fatal(err)
	}
	return tok
}

// good are claims that pass for resource.
func (is *testIssuer) good(resource string) claims {
	now := time.Now()
	return claims{Claims: jwt.Claims{
		Issuer:    is.URL(),
		Subject:   "client-1",
		Audience:  jwt.Audience{resource},
		Expiry:    jwt.NewNumericDate(now.Add(5 * time.Minute)),
		NotBefore: jwt.NewNumericDate(now.Add(-time.Minute)),
		IssuedAt:  jwt.NewNumericDate(now.Add(-time.Minute)),
	}}
}

// opaqueToken registers an opaque token whose introspection answers
// answer, on top of an active token for resource by client-1.
func (is *testIssuer) opaqueToken(resource string, change func(map[string]any)) string {
	is.t.Helper()
	b := make([]byte, 24)
	rand.Read(b)
	tok := base64.RawURLEncoding.EncodeToString(b)
	now := time.Now()
	answer := map[string]any{"active": true, "iss": is.URL(), "client_id": "client-1", "aud": resource,
		"scope": "mcp", "exp": now.Add(5 * time.Minute).Unix(), "iat": now.Unix(), "token_type": "Bearer"}
	if change != nil {
		change(answer)
	}
	is.mu.Lock()
	is.opaque[tok] = answer
	is.mu.Unlock()
	return tok
}
