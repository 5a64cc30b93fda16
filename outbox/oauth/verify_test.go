package oauth_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
)

const resource = "http://127.0.0.1:9/mcp"

func newRS(t *testing.T, is *testIssuer, opts *oauth.Options) *oauth.ResourceServer {
	t.Helper()
	rs, err := oauth.New(is.URL(), resource, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestVerify(t *testing.T) {
	t.Parallel()
	is := newIssuer(t)
	is.addKey("rs", jose.RS256, true)
	is.addKey("ps", jose.PS256, true)
	is.addKey("es", jose.ES256, true)
	is.addKey("stranger", jose.RS256, false)
	rs := newRS(t, is, nil)
	ctx := context.Background()

	t.Run("Accepted", func(t *testing.T) {
		for _, kid := range []string{"rs", "ps", "es"} {
			c := is.good(resource)
			c.Scope = "mcp:call mcp:read"
			ti, err := rs.Verify(ctx, is.mint(kid, c), nil)
			if err != nil {
				t.Fatalf("%s: %v", kid, err)
			}
			if got, want := ti.UserID, "oauth:"+is.URL()+"#client-1"; got != want {
				t.Errorf("%s: principal %q, want %q", kid, got, want)
			}
			if got := strings.Join(ti.Scopes, " "); got != "mcp:call mcp:read" {
				t.Errorf("%s: scopes %q", kid, got)
			}
			if !ti.Expiration.Equal(c.Expiry.Time()) {
				t.Errorf("%s: expiration %v, want %v", kid, ti.Expiration, c.Expiry.Time())
			}
		}
	})

	// Each refusal is a bearer.Refusal (401 invalid_token) naming the
	// check, and an auth.ErrInvalidToken.
	refused := func(t *testing.T, token, want string) {
		t.Helper()
		ti, err := rs.Verify(ctx, token, nil)
		var ref bearer.Refusal
		if !errors.As(err, &ref) || !errors.Is(err, auth.ErrInvalidToken) {
			t.Fatalf("Verify = %+v, %v; want a refusal %q", ti, err, want)
		}
		if string(ref) != want {
			t.Errorf("refusal %q, want %q", ref, want)
		}
	}
	mod := func(f func(*claims)) string {
		c := is.good(resource)
		f(&c)
		return is.mint("rs", c)
	}
	t.Run("WrongAudience", func(t *testing.T) {
		refused(t, mod(func(c *claims) { c.Audience = jwt.Audience{"http://127.0.0.1:9/other"} }), "token issued for another resource")
		// A prefix or the same URL with a trailing slash is another resource.
		refused(t, mod(func(c *claims) { c.Audience = jwt.Audience{resource + "/"} }), "token issued for another resource")
		refused(t, mod(func(c *claims) { c.Audience = nil }), "token issued for another resource")
	})
	t.Run("WrongIssuer", func(t *testing.T) {
		refused(t, mod(func(c *claims) { c.Issuer = "https://evil.example" }), "token issued by another issuer")
	})
	t.Run("Expired", func(t *testing.T) {
		refused(t, mod(func(c *claims) { c.Expiry = jwt.NewNumericDate(time.Now().Add(-time.Minute)) }), "token expired")
	})
	t.Run("ExpiredWithinLeeway", func(t *testing.T) {
		tok := mod(func(c *claims) { c.Expiry = jwt.NewNumericDate(time.Now().Add(-5 * time.Second)) })
		if _, err := rs.Verify(ctx, tok, nil); err != nil {
			t.Fatalf("5s past exp, within the default leeway: %v", err)
		}
	})
	t.Run("NotYetValid", func(t *testing.T) {
		refused(t, mod(func(c *claims) { c.NotBefore = jwt.NewNumericDate(time.Now().Add(time.Hour)) }), "token not yet valid")
	})
	t.Run("IssuedInTheFuture", func(t *testing.T) {
		refused(t, mod(func(c *claims) { c.IssuedAt = jwt.NewNumericDate(time.Now().Add(time.Hour)) }), "token issued in the future")
	})
	t.Run("NoExpiry", func(t *testing.T) {
		refused(t, mod(func(c *claims) { c.Expiry = nil }), "token has no expiry")
	})
	t.Run("NoSubject", func(t *testing.T) {
		refused(t, mod(func(c *claims) { c.Subject = "" }), "token has no subject")
	})
	t.Run("BadSignature", func(t *testing.T) {
		// Signed by a key the issuer never published, under a kid it did.
		tok := is.mint("stranger", is.good(resource))
		h, rest, _ := strings.Cut(tok, ".")
		hdr := decodeSegment(t, h)
		hdr["kid"] = "rs"
		refused(t, encodeSegment(t, hdr)+"."+rest, "token signature invalid")
		// A flipped bit in the payload.
		good := is.mint("rs", is.good(resource))
		parts := strings.Split(good, ".")
		payload := decodeSegment(t, parts[1])
		payload["sub"] = "someone-else"
		refused(t, parts[0]+"."+encodeSegment(t, payload)+"."+parts[2], "token signature invalid")
	})
	t.Run("AlgNone", func(t *testing.T) {
		c := is.good(resource)
		tok := encodeSegment(t, map[string]any{"alg": "none", "kid": "rs", "typ": "at+jwt"}) + "." + encodeClaims(t, c) + "."
		refused(t, tok, "token algorithm not accepted")
	})
	t.Run("HMACWithThePublicKey", func(t *testing.T) {
		// The classic confusion: HS256 "signed" with the bytes of the
		// issuer's public key, which anyone can read from the JWKS.
		is.mu.Lock()
		pub := is.keys["rs"].Public()
		is.mu.Unlock()
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		for _, secret := range [][]byte{der, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})} {
			signing := encodeSegment(t, map[string]any{"alg": "HS256", "kid": "rs", "typ": "at+jwt"}) + "." + encodeClaims(t, is.good(resource))
			mac := hmac.New(sha256.New, secret)
			mac.Write([]byte(signing))
			refused(t, signing+"."+base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), "token algorithm not accepted")
		}
	})
	t.Run("UnknownKid", func(t *testing.T) {
		refused(t, is.mint("stranger", is.good(resource)), "token signed by an unknown key")
	})
	t.Run("Malformed", func(t *testing.T) {
		for _, tok := range []string{"", "abc", "a.b.c", strings.Repeat("a", oauth.MaxTokenBytes+1)} {
			refused(t, tok, "malformed token")
		}
	})
}

func TestNew_Refuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ issuer, resource string }{
		{"http://idp.example.com", resource}, // plain http off loopback
		{"ftp://127.0.0.1/", resource},       // not http
		{"https://idp.example.com/?x=1", resource},
		{"https://idp.example.com", "mcp"}, // relative resource
		{"https://idp.example.com", resource + "#x"},
	} {
		if _, err := oauth.New(tc.issuer, tc.resource, nil); err == nil {
			t.Errorf("New(%q, %q) accepted", tc.issuer, tc.resource)
		}
	}
	if _, err := oauth.New("https://idp.example.com", resource, &oauth.Options{Algorithms: []jose.SignatureAlgorithm{jose.HS256}}); err == nil {
		t.Errorf("New accepted HS256")
	}
	for _, issuer := range []string{"http://127.0.0.1:8080", "http://[::1]:8080/realm", "http://localhost:1", "https://idp.example.com/tenant"} {
		if _, err := oauth.New(issuer, resource, nil); err != nil {
			t.Errorf("New(%q): %v", issuer, err)
		}
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Rotation", func(t *testing.T) {
		is := newIssuer(t)
		is.cacheControl = "max-age=3600"
		is.addKey("k1", jose.RS256, true)
		rs := newRS(t, is, &oauth.Options{RefreshInterval: -1})
		if _, err := rs.Verify(ctx, is.mint("k1", is.good(resource)), nil); err != nil {
			t.Fatal(err)
		}
		// The issuer rotates: k2 in, k1 out. A k2 token is an unknown kid
		// to the cached set, which makes the set be fetched again.
		is.addKey("k2", jose.ES256, false)
		is.publish("k2")
		if _, err := rs.Verify(ctx, is.mint("k2", is.good(resource)), nil); err != nil {
			t.Fatalf("token of the rotated-in key: %v", err)
		}
		_, err := rs.Verify(ctx, is.mint("k1", is.good(resource)), nil)
		if !errors.Is(err, bearer.Refusal("token signed by an unknown key")) {
			t.Fatalf("token of the rotated-out key: %v, want refused as an unknown key", err)
		}
	})

	t.Run("CacheControl", func(t *testing.T) {
		is := newIssuer(t)
		is.cacheControl = "public, max-age=3600"
		is.addKey("k1", jose.RS256, true)
		rs := newRS(t, is, nil)
		for range 5 {
			if _, err := rs.Verify(ctx, is.mint("k1", is.good(resource)), nil); err != nil {
				t.Fatal(err)
			}
		}
		if n := is.jwksFetches.Load(); n != 1 {
			t.Errorf("%d JWKS fetches for 5 tokens within max-age, want 1", n)
		}
	})

	t.Run("NoStore", func(t *testing.T) {
		is := newIssuer(t)
		is.cacheControl = "no-store"
		is.addKey("k1", jose.RS256, true)
		rs := newRS(t, is, &oauth.Options{RefreshInterval: -1})
		for range 3 {
			if _, err := rs.Verify(ctx, is.mint("k1", is.good(resource)), nil); err != nil {
				t.Fatal(err)
			}
		}
		if n := is.jwksFetches.Load(); n != 3 {
			t.Errorf("%d JWKS fetches for 3 tokens with no-store, want 3", n)
		}
	})

	t.Run("UnknownKidRateLimited", func(t *testing.T) {
		is := newIssuer(t)
		is.cacheControl = "max-age=3600"
		is.addKey("k1", jose.RS256, true)
		is.addKey("made-up", jose.RS256, false)
		rs := newRS(t, is, &oauth.Options{RefreshInterval: time.Hour})
		for range 20 {
			if _, err := rs.Verify(ctx, is.mint("made-up", is.good(resource)), nil); err == nil {
				t.Fatal("accepted a token of an unpublished key")
			}
		}
		if n := is.jwksFetches.Load(); n != 1 {
			t.Errorf("%d JWKS fetches for 20 tokens naming an unknown kid, want 1 (rate-limited)", n)
		}
	})

	t.Run("OAuthDiscovery", func(t *testing.T) {
		is := newIssuer(t)
		is.discovery = "oauth" // RFC 8414 only
		is.addKey("k1", jose.ES256, true)
		rs := newRS(t, is, nil)
		if err := rs.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := rs.Verify(ctx, is.mint("k1", is.good(resource)), nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("IssuerMismatch", func(t *testing.T) {
		is := newIssuer(t)
		is.addKey("k1", jose.RS256, true)
		// Configured with a trailing slash the document does not have:
		// RFC 8414 wants the two identical.
		rs, err := oauth.New(is.URL()+"/", resource, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The error says what to configure instead.
		if err := rs.Check(ctx); err == nil || !strings.Contains(err.Error(), "names issuer") ||
			!strings.Contains(err.Error(), "configure the issuer exactly as \""+is.URL()+"\"") {
			t.Fatalf("Check = %v, want an issuer mismatch naming the issuer to configure", err)
		}
		// Then a token cannot be judged: not the client's fault.
		_, err = rs.Verify(ctx, is.mint("k1", is.good(resource)), nil)
		var ref bearer.Refusal
		if err == nil || errors.As(err, &ref) {
			t.Fatalf("Verify = %v, want an error that is not a refusal", err)
		}
	})
}

func decodeSegment(t *testing.T, s string) map[string]any {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func encodeSegment(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func encodeClaims(t *testing.T, c claims) string { return encodeSegment(t, c) }
