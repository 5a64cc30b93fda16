package bearer_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

// A tokens file names each principal with the hash of its token; the
// Verifier turns a request's token into its principal.
func Example() {
	token := "alice-s-token" // in practice from mcp-outbox token new
	file := "# PRINCIPAL SHA256HEX\nalice " + bearer.Hash(token) + "\n"
	toks, err := bearer.ParseFile([]byte(file))
	if err != nil {
		log.Fatal(err)
	}
	v := bearer.NewVerifier(toks)

	mcpHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello", auth.TokenInfoFromContext(r.Context()).UserID)
	})
	h := v.Require(mcpHandler)
	for _, authorization := range []string{"Bearer " + token, "Bearer guessed", ""} {
		req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("%d %s", rec.Code, rec.Body)
	}
	_, err = v.Verify(context.Background(), "guessed", nil)
	fmt.Println(err)
	// Output:
	// 200 hello alice
	// 401 invalid token
	// 401 authentication required
	// invalid token
}
