package bearer_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/internal/tokens"
	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

// BenchmarkRequire is what Require adds to every accepted request: the
// token's check, and the guess limiter's look (issue 37), in parallel as
// requests arrive. Compare with BenchmarkRequire/none, the handler alone.
func BenchmarkRequire(b *testing.B) {
	token, _ := tokens.NewToken()
	hash, _ := bearer.ParseHash(bearer.Hash(token))
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{
		{"none", next},
		{"require", bearer.NewVerifier([]bearer.Token{{Principal: "alice", Hash: hash}}).Require(next)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
				req.Header.Set("Authorization", "Bearer "+token)
				for pb.Next() {
					rec := httptest.NewRecorder()
					bc.h.ServeHTTP(rec, req)
					if rec.Code != http.StatusOK {
						b.Fatalf("status %d", rec.Code)
					}
				}
			})
		})
	}
}
