package oauth_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
)

// A library user mounts the MCP endpoint behind the resource server, and
// its metadata at the well-known paths. A client without a token learns
// from the 401 where the metadata is, and from the metadata which
// authorization server issues tokens for this resource.
func Example() {
	rs, err := oauth.New("https://idp.example.com", "https://mcp.example.com/mcp", &oauth.Options{
		ScopesRequired: []string{"mcp"},
		ToolScopes:     map[string][]string{"charge": {"payments:write"}},
		ResourceName:   "Payments",
	})
	if err != nil {
		log.Fatal(err)
	}
	mcpHandler := http.NotFoundHandler() // in practice mcphttp.NewHandler(server, nil)
	mux := http.NewServeMux()
	mux.Handle("/mcp", rs.Require(mcpHandler))
	for _, p := range rs.MetadataPaths() {
		mux.Handle(p, rs.MetadataHandler())
	}

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mcp", nil))
	fmt.Println(rec.Code, rec.Header().Get("WWW-Authenticate"))

	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/.well-known/oauth-protected-resource/mcp", nil))
	b, _ := io.ReadAll(rec.Body)
	fmt.Print(string(b))
	// Output:
	// 401 Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp", scope="mcp"
	// {"resource":"https://mcp.example.com/mcp","authorization_servers":["https://idp.example.com"],"scopes_supported":["mcp","payments:write"],"bearer_methods_supported":["header"],"resource_name":"Payments"}
}
