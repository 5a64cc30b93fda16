package main

import (
	"flag"
	"fmt"
	"net/http"

	"github.com/mcp-outbox/mcp-outbox/internal/inflight"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

// inflightLimits are serve's and proxy's bounds on the requests /mcp
// serves at once (mcphttp.Options.MaxInFlight and
// MaxInFlightPerPrincipal): 0 means the library's default, a negative
// value no bound.
type inflightLimits struct {
	total, perPrincipal int
}

// inflightFlags adds --max-in-flight and --max-in-flight-per-principal.
func inflightFlags(env *environment, fs *flag.FlagSet, l *inflightLimits) error {
	for _, f := range []struct {
		n         *int
		flag, env string
		usage     string
	}{
		{&l.total, "max-in-flight", "MCP_OUTBOX_MAX_IN_FLIGHT", fmt.Sprintf(
			"with --http: at most this many requests to /mcp at once (a session's event stream aside); one more is refused with 503 and Retry-After; 0 means %d, negative no bound",
			mcphttp.DefaultMaxInFlight)},
		{&l.perPrincipal, "max-in-flight-per-principal", "MCP_OUTBOX_MAX_IN_FLIGHT_PER_PRINCIPAL", fmt.Sprintf(
			"with --http: at most this many requests to /mcp at once per principal of --tokens or --oauth-issuer (without authentication only --max-in-flight applies); one more is refused with 429 and Retry-After; 0 means %d, negative no bound",
			mcphttp.DefaultMaxInFlightPerPrincipal)},
	} {
		v, err := env.envInt(f.env, 0)
		if err != nil {
			return err
		}
		fs.IntVar(f.n, f.flag, v, f.usage+" ["+f.env+"]")
	}
	return nil
}

// options puts the bounds into serve's mcphttp.Options.
func (l inflightLimits) options(o *mcphttp.Options) {
	o.MaxInFlight, o.MaxInFlightPerPrincipal = l.total, l.perPrincipal
}

// wrap bounds the proxy's /mcp, whose handler is the sidecar's, by the
// same rules as mcphttp.NewHandler's.
func (l inflightLimits) wrap(h http.Handler, o *mcphttp.Options) http.Handler {
	return inflight.New(inflight.Limits{
		Total:           orDefault(l.total, mcphttp.DefaultMaxInFlight),
		PerPrincipal:    orDefault(l.perPrincipal, mcphttp.DefaultMaxInFlightPerPrincipal),
		TotalHow:        "mcp-outbox proxy --max-in-flight, MCP_OUTBOX_MAX_IN_FLIGHT",
		PerPrincipalHow: "mcp-outbox proxy --max-in-flight-per-principal, MCP_OUTBOX_MAX_IN_FLIGHT_PER_PRINCIPAL",
	}, o.Logger).Wrap(h)
}

// orDefault is v, def when v is zero, and 0 (no bound) when negative.
func orDefault(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}
