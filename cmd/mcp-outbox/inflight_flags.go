package main

import (
	"flag"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/inflight"
	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

// inflightLimits are serve's and proxy's bounds on the requests /mcp
// serves at once (mcphttp.Options.MaxInFlight and
// MaxInFlightPerPrincipal): 0 means the library's default, a negative
// value no bound.
type inflightLimits struct {
	total, perPrincipal, bytesPerPrincipal int
}

// inflightFlags adds --max-in-flight, --max-in-flight-per-principal and
// --max-in-flight-bytes-per-principal.
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
		{&l.bytesPerPrincipal, "max-in-flight-bytes-per-principal", "MCP_OUTBOX_MAX_IN_FLIGHT_BYTES_PER_PRINCIPAL", fmt.Sprintf(
			"with --http: at most this many bytes of request bodies to /mcp at once per principal, by Content-Length (what bounds memory; a principal with nothing in flight is always let in); one more is refused with 429 and Retry-After; 0 means %d (8 bodies of 4 MiB), negative no bound",
			mcphttp.DefaultMaxInFlightBytesPerPrincipal)},
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
	o.MaxInFlightBytesPerPrincipal = int64(l.bytesPerPrincipal)
}

// wrap bounds the proxy's /mcp, whose handler is the sidecar's, by the
// same rules as mcphttp.NewHandler's.
func (l inflightLimits) wrap(h http.Handler, o *mcphttp.Options) http.Handler {
	return inflight.New(inflight.Limits{
		Total:                orDefault(l.total, mcphttp.DefaultMaxInFlight),
		PerPrincipal:         orDefault(l.perPrincipal, mcphttp.DefaultMaxInFlightPerPrincipal),
		TotalHow:             "mcp-outbox proxy --max-in-flight, MCP_OUTBOX_MAX_IN_FLIGHT",
		PerPrincipalHow:      "mcp-outbox proxy --max-in-flight-per-principal, MCP_OUTBOX_MAX_IN_FLIGHT_PER_PRINCIPAL",
		PerPrincipalBytes:    orDefault(int64(l.bytesPerPrincipal), mcphttp.DefaultMaxInFlightBytesPerPrincipal),
		UnknownLength:        mcp.DefaultMaxRequestBodyBytes,
		PerPrincipalBytesHow: "mcp-outbox proxy --max-in-flight-bytes-per-principal, MCP_OUTBOX_MAX_IN_FLIGHT_BYTES_PER_PRINCIPAL",
	}, o.Logger).Wrap(h)
}

// orDefault is v, def when v is zero, and 0 (no bound) when negative.
func orDefault[T int | int64](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}
