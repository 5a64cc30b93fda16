package main

import (
	"flag"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/sidecar"
)

// proxyBounds are the proxy's flags that bound what it holds: the wait for
// a forwarded call's answer, and its HTTP sessions (each with an upstream,
// for a command its own process).
type proxyBounds struct {
	callTimeout, idleTimeout          time.Duration
	maxSessions, maxSessionsPrincipal int
}

func (b *proxyBounds) flags(env *environment, fs *flag.FlagSet) error {
	for _, f := range []struct {
		d         *time.Duration
		flag, env string
		def       time.Duration
		usage     string
	}{
		{&b.callTimeout, "call-timeout", "MCP_OUTBOX_CALL_TIMEOUT", sidecar.DefaultCallTimeout,
			"how long a forwarded tool call waits for the upstream's answer, whether or not its client still waits; then it is settled as a lost answer (unknown; with --cooperating, what the upstream recorded, or released for a retry) and the client gets an error"},
		{&b.idleTimeout, "session-idle-timeout", "MCP_OUTBOX_SESSION_IDLE_TIMEOUT", sidecar.DefaultSessionIdleTimeout,
			"with --http: a session with no request open and no call running for this long ends, and its upstream (process) is stopped"},
	} {
		v, err := env.envDuration(f.env, f.def)
		if err != nil {
			return err
		}
		fs.DurationVar(f.d, f.flag, v, f.usage+" ["+f.env+"]")
	}
	for _, f := range []struct {
		n         *int
		flag, env string
		def       int
		usage     string
	}{
		{&b.maxSessions, "max-sessions", "MCP_OUTBOX_MAX_SESSIONS", sidecar.DefaultMaxSessions,
			"with --http: at most this many sessions at once; one more is refused with 503"},
		{&b.maxSessionsPrincipal, "max-sessions-per-principal", "MCP_OUTBOX_MAX_SESSIONS_PER_PRINCIPAL", sidecar.DefaultMaxSessionsPerPrincipal,
			"with --http: at most this many sessions at once per principal (all clients are one principal without --tokens or --oauth-issuer); one more is refused with 429"},
	} {
		v, err := env.envInt(f.env, f.def)
		if err != nil {
			return err
		}
		fs.IntVar(f.n, f.flag, v, f.usage+" ["+f.env+"]")
	}
	return nil
}

// validate refuses values that would turn a bound off.
func (b *proxyBounds) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--call-timeout", b.callTimeout}, {"--session-idle-timeout", b.idleTimeout}} {
		if d.v <= 0 {
			return usagef("%s %v: want a positive duration", d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"--max-sessions", b.maxSessions}, {"--max-sessions-per-principal", b.maxSessionsPrincipal}} {
		if n.v <= 0 {
			return usagef("%s %d: want a positive number", n.name, n.v)
		}
	}
	return nil
}

func (b *proxyBounds) apply(o *sidecar.Options) {
	o.CallTimeout, o.SessionIdleTimeout = b.callTimeout, b.idleTimeout
	o.MaxSessions, o.MaxSessionsPerPrincipal = b.maxSessions, b.maxSessionsPrincipal
}
