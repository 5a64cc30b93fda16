package mcphttp_test

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

// One endpoint serves both protocol generations: a client that asks for
// 2025-11-25 gets a session, a current one is served statelessly.
func Example() {
	server := mcp.NewServer(&mcp.Implementation{Name: "example", Version: "v0"}, nil)
	srv := httptest.NewServer(mcphttp.NewHandler(server, nil))
	defer srv.Close()

	ctx := context.Background()
	for _, version := range []string{"2025-11-25", ""} {
		client := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, nil)
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("protocol %s, session: %v\n", cs.InitializeResult().ProtocolVersion, cs.ID() != "")
		cs.Close()
	}
	// Output:
	// protocol 2025-11-25, session: true
	// protocol 2026-07-28, session: false
}
