package oauth_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
)

func TestIntrospection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	is := newIssuer(t)
	rs := newRS(t, is, &oauth.Options{Introspection: &oauth.Introspection{ClientID: "rs", ClientSecret: "rs-secret", CacheTTL: time.Hour}})

	t.Run("Active", func(t *testing.T) {
		tok := is.opaqueToken(resource, nil)
		before := is.introspections.Load()
		for range 3 {
			ti, err := rs.Verify(ctx, tok, nil)
			if err != nil {
				t.Fatal(err)
			}
			// No sub: the client the token was issued to is the subject.
			if ti.UserID != oauth.Principal(is.URL(), "client-1") || len(ti.Scopes) != 1 || ti.Scopes[0] != "mcp" {
				t.Fatalf("token info %+v", ti)
			}
		}
		if n := is.introspections.Load() - before; n != 1 {
			t.Errorf("%d introspections for 3 uses of one token, want 1 (cached)", n)
		}
	})

	for _, tc := range []struct {
		name   string
		change func(map[string]any)
		want   string
	}{
		{"Inactive", func(a map[string]any) { a["active"] = false }, "token not active"},
		{"WrongAudience", func(a map[string]any) { a["aud"] = []string{"http://127.0.0.1:9/other"} }, "token issued for another resource"},
		{"NoAudience", func(a map[string]any) { delete(a, "aud") }, "token issued for another resource"},
		{"WrongIssuer", func(a map[string]any) { a["iss"] = "https://evil.example" }, "token issued by another issuer"},
		{"Expired", func(a map[string]any) { a["exp"] = time.Now().Add(-time.Hour).Unix() }, "token expired"},
		{"NoExpiry", func(a map[string]any) { delete(a, "exp") }, "token has no expiry"},
		{"NotYetValid", func(a map[string]any) { a["nbf"] = time.Now().Add(time.Hour).Unix() }, "token not yet valid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rs.Verify(ctx, is.opaqueToken(resource, tc.change), nil)
			if !errors.Is(err, bearer.Refusal(tc.want)) {
				t.Fatalf("Verify = %v, want refusal %q", err, tc.want)
			}
		})
	}

	t.Run("Unknown", func(t *testing.T) {
		_, err := rs.Verify(ctx, "never-issued", nil)
		if !errors.Is(err, bearer.Refusal("token not active")) {
			t.Fatalf("Verify = %v", err)
		}
	})

	t.Run("WrongClientSecret", func(t *testing.T) {
		bad := newRS(t, is, &oauth.Options{Introspection: &oauth.Introspection{ClientID: "rs", ClientSecret: "wrong"}})
		_, err := bad.Verify(ctx, is.opaqueToken(resource, nil), nil)
		var ref bearer.Refusal
		if err == nil || errors.As(err, &ref) {
			t.Fatalf("Verify = %v, want an error that is not the token's fault", err)
		}
	})

	t.Run("CheckFindsNoEndpoint", func(t *testing.T) {
		// An issuer that names no introspection endpoint: Check says so at
		// start-up, rather than every opaque token getting 503.
		is := newIssuer(t)
		is.addKey("k1", jose.ES256, true)
		is.noIntrospection = true
		rs := newRS(t, is, &oauth.Options{Introspection: &oauth.Introspection{ClientID: "rs", ClientSecret: "rs-secret"}})
		if err := rs.Check(ctx); err == nil || !strings.Contains(err.Error(), "names no introspection_endpoint") {
			t.Fatalf("Check = %v, want the missing endpoint named", err)
		}
		if err := newRS(t, is, nil).Check(ctx); err != nil {
			t.Fatalf("Check without introspection = %v", err)
		}
	})

	t.Run("WithoutIntrospection", func(t *testing.T) {
		plain := newRS(t, is, nil)
		if _, err := plain.Verify(ctx, is.opaqueToken(resource, nil), nil); !errors.Is(err, bearer.Refusal("malformed token")) {
			t.Fatalf("Verify = %v, want an opaque token refused as malformed", err)
		}
	})
}
