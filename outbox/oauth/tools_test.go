package oauth_test

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
)

// TestCheckTools: a tool scope for a tool the server does not offer (a
// typo, another case) is reported, naming it and the tools there are; one
// for every offered tool passes.
func TestCheckTools(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := mcp.NewServer(&mcp.Implementation{Name: "s", Version: "v1"}, nil)
	for _, name := range []string{"charge", "refund"} {
		mcp.AddTool(server, &mcp.Tool{Name: name}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, struct{}, error) {
			return nil, struct{}{}, nil
		})
	}
	check := func(tools map[string][]string) error {
		t.Helper()
		rs, err := oauth.New("https://idp.example.com", "https://mcp.example.com/mcp", &oauth.Options{ToolScopes: tools})
		if err != nil {
			t.Fatal(err)
		}
		return rs.CheckTools(ctx, server)
	}
	if err := check(map[string][]string{"charge": {"payments:write"}, "refund": {"payments:refund"}}); err != nil {
		t.Errorf("every tool offered: %v", err)
	}
	if err := check(nil); err != nil {
		t.Errorf("no tool scopes: %v", err)
	}
	err := check(map[string][]string{"chrage": {"payments:write"}, "Refund": {"payments:refund"}, "charge": {"x"}})
	if err == nil || !strings.Contains(err.Error(), "Refund, chrage") || !strings.Contains(err.Error(), "its tools: charge, refund") {
		t.Errorf("misspelt tools: %v, want them named with the tools there are", err)
	}
}
