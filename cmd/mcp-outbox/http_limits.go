package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/mcphttp"
)

// httpLimits are serve's and proxy's flags that bound what a client holds
// of the --http listener: the time of a request's body, idle connections,
// and open connections (mcphttp.Options). As there, 0 is the default and
// a negative value turns the bound off.
type httpLimits struct {
	bodyTimeout, idleTimeout    time.Duration
	maxConns, maxConnsPerClient int
}

func (l *httpLimits) flags(env *environment, fs *flag.FlagSet) error {
	for _, f := range []struct {
		d         *time.Duration
		flag, env string
		usage     string
	}{
		{&l.bodyTimeout, "body-timeout", "MCP_OUTBOX_BODY_TIMEOUT", fmt.Sprintf(
			"with --http: a request's body must arrive within this long of its headers, else the client gets 408 and its connection is closed; "+
				"0 means %v, negative no bound", mcphttp.DefaultBodyTimeout)},
		{&l.idleTimeout, "conn-idle-timeout", "MCP_OUTBOX_CONN_IDLE_TIMEOUT", fmt.Sprintf(
			"with --http: a connection idle this long between requests is closed (an event stream is never idle); "+
				"0 means %v, negative no bound", mcphttp.DefaultIdleTimeout)},
	} {
		v, err := env.envDuration(f.env, 0)
		if err != nil {
			return err
		}
		fs.DurationVar(f.d, f.flag, v, f.usage+" ["+f.env+"]")
	}
	for _, f := range []struct {
		n         *int
		flag, env string
		usage     string
	}{
		{&l.maxConns, "max-conns", "MCP_OUTBOX_MAX_CONNS", fmt.Sprintf(
			"with --http: at most this many open connections; one more is answered 503 and closed; "+
				"0 means %d, or half the process's open-file limit (ulimit -n) if lower; negative no bound", mcphttp.DefaultMaxConns)},
		{&l.maxConnsPerClient, "max-conns-per-client", "MCP_OUTBOX_MAX_CONNS_PER_CLIENT", fmt.Sprintf(
			"with --http: at most this many open connections from one client address (an IPv6 client's /64); one more is answered 503 and closed; "+
				"0 means %d, or a quarter of --max-conns if lower; a loopback peer (a proxy on this host) is not bounded per client; behind a reverse proxy on another host every client is the proxy's address: raise it, or turn it off with a negative value",
			mcphttp.DefaultMaxConnsPerClient)},
	} {
		v, err := env.envInt(f.env, 0)
		if err != nil {
			return err
		}
		fs.IntVar(f.n, f.flag, v, f.usage+" ["+f.env+"]")
	}
	return nil
}

func (l httpLimits) apply(o *mcphttp.Options) {
	o.BodyTimeout, o.IdleTimeout = l.bodyTimeout, l.idleTimeout
	o.MaxConns, o.MaxConnsPerClient = l.maxConns, l.maxConnsPerClient
}
