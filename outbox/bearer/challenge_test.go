package bearer_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

// TestRequire_Challenges: static tokens answer with RFC 6750 challenges
// too, and never repeat what the client sent.
func TestRequire_Challenges(t *testing.T) {
	t.Parallel()
	const token = "alice-s-secret-token"
	v := bearer.NewVerifier([]bearer.Token{{Principal: "alice", Hash: mustHash(t, bearer.Hash(token))}})
	h := v.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(auth.TokenInfoFromContext(r.Context()).UserID))
	}))
	for _, tc := range []struct {
		authorization string
		status        int
		challenge     string
	}{
		{"", 401, `Bearer realm="mcp-outbox"`},
		{"Basic YWxpY2U6c2VjcmV0", 401, `Bearer realm="mcp-outbox"`},
		{"Bearer " + token + "-guessed", 401, `Bearer realm="mcp-outbox", error="invalid_token", error_description="invalid token"`},
		{"Bearer " + token + " extra", 400, `Bearer realm="mcp-outbox", error="invalid_request", error_description="want 'Authorization: Bearer TOKEN'"`},
		{"bearer " + token, 200, ""},
	} {
		req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		if tc.authorization != "" {
			req.Header.Set("Authorization", tc.authorization)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		got := rec.Header().Get("WWW-Authenticate")
		if rec.Code != tc.status || got != tc.challenge {
			t.Errorf("%q: %d %q, want %d %q", tc.authorization, rec.Code, got, tc.status, tc.challenge)
		}
		if rec.Code != 200 && (strings.Contains(rec.Body.String(), "secret") || strings.Contains(got, "secret")) {
			t.Errorf("%q: answer repeats the token: %q", tc.authorization, rec.Body)
		}
	}
}

// TestRequire_Scope: a token without a required scope gets 403 with
// error="insufficient_scope" and the scopes, which the go-sdk's own
// middleware leaves out.
func TestRequire_Scope(t *testing.T) {
	t.Parallel()
	verify := func(_ context.Context, tok string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: "u", Scopes: strings.Split(tok, "+")}, nil
	}
	h := bearer.Require(verify, &bearer.RequireOptions{ResourceMetadataURL: `https://rs.example/.well-known/oauth-protected-resource/mcp`, Scopes: []string{"a", "b"}})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, tc := range []struct {
		token     string
		status    int
		challenge string
	}{
		{"a", 403, `Bearer resource_metadata="https://rs.example/.well-known/oauth-protected-resource/mcp", error="insufficient_scope", error_description="insufficient scope", scope="a b"`},
		{"b+a", 200, ""},
	} {
		req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		req.Header.Set("Authorization", "Bearer "+tc.token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if got := rec.Header().Get("WWW-Authenticate"); rec.Code != tc.status || got != tc.challenge {
			t.Errorf("%q: %d %q, want %d %q", tc.token, rec.Code, got, tc.status, tc.challenge)
		}
	}
}

func mustHash(t *testing.T, h string) []byte {
	t.Helper()
	b, err := bearer.ParseHash(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
