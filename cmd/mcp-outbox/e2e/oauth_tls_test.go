package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// TestOAuthIssuerHTTPS: serve reaches an https issuer through the system's
// trust store, which honours SSL_CERT_FILE: with the issuer's CA there, a
// token the issuer signed is accepted; without it, serve warns at start and
// answers 503 (the token cannot be judged), never 200 and never 401.
func TestOAuthIssuerHTTPS(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	issuer := httptest.NewUnstartedServer(mux)
	issuer.StartTLS()
	t.Cleanup(issuer.Close)
	mux.HandleFunc("/.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"issuer": issuer.URL, "jwks_uri": issuer.URL + "/jwks"})
	})
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: issuer.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		env    []string
		status int
	}{
		{"TrustedBySSLCertFile", []string{"SSL_CERT_FILE=" + caFile}, http.StatusOK},
		{"Untrusted", []string{"SSL_CERT_FILE=" + filepath.Join(t.TempDir(), "none.pem")}, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := freeLoopbackAddr(t)
			resource := "http://" + addr + "/mcp"
			cmd := exec.Command(bin, "serve", "--db", filepath.Join(t.TempDir(), "ledger.db"), "--http", addr, "--log-level", "warn",
				"--oauth-issuer", issuer.URL, "--oauth-audience", resource)
			cmd.Env = append(os.Environ(), tc.env...)
			startHTTPCommand(t, cmd)

			sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("at+jwt").WithHeader("kid", "k1"))
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			tok, err := jwt.Signed(sig).Claims(jwt.Claims{Issuer: issuer.URL, Subject: "svc", Audience: jwt.Audience{resource},
				Expiry: jwt.NewNumericDate(now.Add(time.Minute)), IssuedAt: jwt.NewNumericDate(now)}).Serialize()
			if err != nil {
				t.Fatal(err)
			}
			if status := postInitialize(t, resource, "Bearer "+tok); status != tc.status {
				t.Errorf("initialize with the issuer's token: %d, want %d", status, tc.status)
			}
		})
	}
}
