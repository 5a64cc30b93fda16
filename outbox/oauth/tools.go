package oauth

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CheckTools reports the tools named in Options.ToolScopes that server
// does not offer. Tool names are matched exactly, so a misspelt one
// protects nothing and says nothing: call CheckTools once the tools are
// registered, before serving. It lists them as a client would, over an
// in-memory session that it closes again.
//
// A server whose tools come and go (a proxy whose upstream decides) can
// only be checked against what it offers now.
func (rs *ResourceServer) CheckTools(ctx context.Context, server *mcp.Server) error {
	if len(rs.opts.ToolScopes) == 0 {
		return nil
	}
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		return fmt.Errorf("check tool scopes: %w", err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "oauth-check-tools", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		return fmt.Errorf("check tool scopes: %w", err)
	}
	defer cs.Close()
	var have []string
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("check tool scopes: list tools: %w", err)
		}
		have = append(have, t.Name)
	}
	var unknown []string
	for name := range rs.opts.ToolScopes {
		if !slices.Contains(have, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	slices.Sort(have)
	return fmt.Errorf("tool scopes name tools the server does not offer, so they protect nothing: %s (its tools: %s)",
		strings.Join(unknown, ", "), strings.Join(have, ", "))
}
