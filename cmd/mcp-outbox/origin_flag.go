package main

import (
	"flag"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/internal/origin"
)

// originFlag adds --allowed-origin, the origins besides the server's own
// whose web pages may use /mcp (mcphttp.Options.AllowedOrigins,
// sidecar.Options.AllowedOrigins): repeatable, each value one origin or
// several comma-separated. MCP_OUTBOX_ALLOWED_ORIGINS (comma-separated)
// holds them when the flag is not given.
func originFlag(env *environment, fs *flag.FlagSet, p *[]string) error {
	v := &originsValue{p: p}
	if s := env.envDefault("MCP_OUTBOX_ALLOWED_ORIGINS", ""); s != "" {
		if err := v.Set(s); err != nil {
			return usagef("MCP_OUTBOX_ALLOWED_ORIGINS: %v", err)
		}
		v.fromFlag = false // the first --allowed-origin replaces them
	}
	fs.Var(v, "allowed-origin", "with --http, let web pages of `ORIGIN` (scheme://host[:port]) use /mcp, besides the server's own; "+
		"repeatable or comma-separated. A request with any other Origin header gets 403; one without (MCP clients that are not browsers) is served [MCP_OUTBOX_ALLOWED_ORIGINS]")
	return nil
}

// originsValue is --allowed-origin's value.
type originsValue struct {
	p        *[]string
	fromFlag bool // *p holds what the flag gave, not the environment's
}

func (v *originsValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v *originsValue) Set(s string) error {
	if !v.fromFlag {
		*v.p, v.fromFlag = nil, true
	}
	for _, o := range strings.Split(s, ",") {
		o = strings.TrimSpace(o)
		if o == "" {
			continue
		}
		if err := origin.Valid(o); err != nil {
			return err
		}
		*v.p = append(*v.p, o)
	}
	return nil
}
