package operator

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/guesslimit"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/layerinfo"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
)

// Options configure every constructor of this package; each reads the
// fields it needs and ignores the others. Nil Options are the zero value:
// mounted at the root, loopback clients only, the page's key kept in the
// database.
type Options struct {
	// Logger gets the operator surface's logs: actions, faults under their
	// error ids, refused guesses. Nil means slog.Default(): what an
	// answer's error id points to must be somewhere.
	Logger *slog.Logger
	// Keys open the recorded results the page shows when the layer seals
	// them (outbox.Options.Keys); nil shows plaintext ones only.
	Keys seal.KeyRing
	// AdminTokenSHA256 is the SHA-256 of the admin token, 32 bytes: the
	// bytes, not the hex (bearer.ParseHash(bearer.Hash(token)), or
	// ParseHash of what 'mcp-outbox token hash' prints).
	// With it, the admin API, the page and the metrics admit whoever
	// presents the token, from any address (the page through a login
	// session). Without it they answer only loopback clients that address
	// the server by a loopback name, and must not be put behind a reverse
	// proxy.
	AdminTokenSHA256 []byte
	// OAuth, when set, admits OAuth access tokens in the Authorization
	// header, from any address, by scope: see [OAuth]. The admin token
	// still admits as before, and the page's login form takes it only.
	// The loopback rule is off with OAuth: a request without a token is
	// refused from loopback too, since a proxy on this host would make
	// every client look local. Nil admits no OAuth token.
	OAuth *OAuth
	// BasePath is where the handler is mounted, such as "/ops/": its
	// links, form actions, redirects and cookie paths start with it. The
	// handler serves requests whose path starts with BasePath, and also
	// the same paths with BasePath already stripped (http.StripPrefix),
	// so that it can be mounted either way. Empty means "/". A missing
	// leading or trailing slash is added.
	BasePath string
	// Dispatcher is this process's dispatcher: the *outbox.Runner that
	// Layer.Start returned, or a *dispatch.Dispatcher run by hand. With
	// it /readyz answers 503 while it is not running, and the readiness,
	// the metrics and the page report effects pending for destinations it
	// does not deliver to. Nil skips both checks (a process that runs no
	// dispatcher), unless Layer is set.
	Dispatcher Dispatcher
	// Layer is the process's layer. A nil Dispatcher then means the Runner
	// of the layer's Start as it is when asked (Start may come after the
	// handler is built), and /readyz reports "degraded" while the layer was
	// never started: nothing in this process delivers the effects its calls
	// enqueue (see Layer.Start; a Start with NoDispatcher says another
	// process does, and is not degraded). Nil Keys mean the layer's.
	// Nil Layer judges by Dispatcher alone, which cannot tell a forgotten
	// Start from a process that delivers nothing on purpose.
	Layer *outbox.Layer
	// SessionKey signs the page's login sessions and flash messages
	// (HMAC-SHA256): at least 32 bytes, the same on every replica. Nil
	// means the key kept in the database (table operator_secret), which
	// the first process that needs one generates; every replica on that
	// database then finds the same key. Changing or deleting the key ends
	// every session.
	SessionKey []byte
	// Registry is what the metrics handler serves, and registers the Go
	// runtime's, the process's and the outbox depth collectors into: pass
	// the registry given to outbox.NewMetrics, so that the outbox's own
	// counters are served too. Nil means a registry of its own.
	Registry *prometheus.Registry
	// Now is the clock of the page's login sessions and of the limit on
	// failed authentications; nil means time.Now.
	Now func() time.Time

	// guesses limits wrong admin tokens and refused OAuth tokens per
	// client; NewHandler makes one for the admin API, the metrics and the
	// page (its login included), so that they share one budget: each of
	// them guesses the same token.
	guesses *guesslimit.Limiter
}

// Dispatcher is what the operator surface reads of the process's
// dispatcher; an *outbox.Runner and a *dispatch.Dispatcher have both
// methods.
type Dispatcher interface {
	// Running reports whether it is delivering.
	Running() bool
	// Destinations names the destinations it delivers to; nil when it does
	// not know yet, which skips the check for unconfigured destinations.
	Destinations() []string
}

var _ Dispatcher = (*dispatch.Dispatcher)(nil)

// layerDispatcher is Options.Layer's Runner, read when asked: Start may
// come after the handler is built, and Stop and a new Start may follow.
type layerDispatcher struct{ l *outbox.Layer }

// Running: a layer never started is not a dispatcher that stopped (which
// is unavailable), but degraded; readiness tells the two apart by
// whether the layer ever started, and the page and the metrics need no
// dispatcher running.
func (d layerDispatcher) Running() bool {
	if r := d.l.Runner(); r != nil {
		return r.Running()
	}
	return !layerinfo.Of(d.l).Started()
}

// Destinations are the running Start's; nil (no judgement) without one.
func (d layerDispatcher) Destinations() []string {
	if r := d.l.Runner(); r != nil {
		return r.Destinations()
	}
	return nil
}

// options returns a copy of opts with defaults filled in.
func options(opts *Options) (Options, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Layer != nil {
		if o.Dispatcher == nil {
			o.Dispatcher = layerDispatcher{o.Layer}
		}
		if o.Keys == nil {
			o.Keys = layerinfo.Of(o.Layer).Keys()
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.guesses == nil {
		o.guesses = guesslimit.New(guesslimit.Options{Surface: "operator", Max: operate.MaxLoginFailures, Logger: o.Logger, Now: o.Now})
	}
	base, err := cleanBasePath(o.BasePath)
	if err != nil {
		return o, err
	}
	o.BasePath = base
	if o.OAuth != nil {
		oa := *o.OAuth
		if err := checkOAuthOptions(&oa); err != nil {
			return o, err
		}
		o.OAuth = &oa
	}
	if o.AdminTokenSHA256 != nil && len(o.AdminTokenSHA256) != sha256.Size {
		// The hex of bearer.Hash, converted with []byte, is 64 bytes: it
		// would compile, and refuse the right token as a wrong one.
		return o, fmt.Errorf("operator: AdminTokenSHA256 has %d bytes, want the %d bytes of the token's SHA-256 "+
			"(bearer.ParseHash of the hex that bearer.Hash and 'mcp-outbox token hash' give)", len(o.AdminTokenSHA256), sha256.Size)
	}
	if o.SessionKey != nil && len(o.SessionKey) < minSessionKey {
		return o, fmt.Errorf("operator: SessionKey has %d bytes, want at least %d", len(o.SessionKey), minSessionKey)
	}
	return o, nil
}

// mustOptions is options for the constructors that return no error: a bad
// BasePath is a programming mistake, reported as mcp.AddTool reports one.
func mustOptions(opts *Options) Options {
	o, err := options(opts)
	if err != nil {
		panic(err)
	}
	return o
}

// cleanBasePath makes a base path start and end with a slash, and refuses
// what could not be a path prefix.
func cleanBasePath(p string) (string, error) {
	if strings.ContainsAny(p, "?#\\ ") || strings.Contains(p, "..") || strings.Contains(p, "//") {
		return "", fmt.Errorf("operator: BasePath %q: want a path such as /ops/", p)
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p, nil
}

// underBase serves h on the paths below base: it strips base from the
// request's path (when the mux has not already), so that h routes on
// paths from "/". The request h sees carries no chi route context: h's own
// chi router then routes on the path afresh, whether the outer mux is chi
// (whose Mount leaves the path whole) or http.ServeMux.
func underBase(base string, h http.Handler) http.Handler {
	if base == "/" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		switch rest, ok := strings.CutPrefix(p, base); {
		case ok:
			p = "/" + rest
		case p+"/" == base:
			p = "/"
		}
		r2 := r.WithContext(context.WithValue(r.Context(), chi.RouteCtxKey, nil))
		u := *r.URL
		u.Path, u.RawPath = p, ""
		r2.URL = &u
		h.ServeHTTP(w, r2)
	})
}

// stripAware serves h, whose routes include base, also when the mux in
// front has stripped base already (http.StripPrefix): it puts base back.
func stripAware(base string, h http.Handler) http.Handler {
	if base == "/" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; !strings.HasPrefix(p, base) && p+"/" != base {
			r2 := *r
			u := *r.URL
			u.Path, u.RawPath = base+strings.TrimPrefix(p, "/"), ""
			r2.URL = &u
			r = &r2
		}
		h.ServeHTTP(w, r)
	})
}
