package operator

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Options configure [NewHandler]. The zero value serves loopback clients
// only, without metrics, and reports ready while the database is.
type Options struct {
	// Logger gets the operator surface's logs; nil discards them.
	Logger *slog.Logger
	// AdminTokenSHA256 is the SHA-256 of the admin token (bearer.Hash).
	// With it, the admin API, the page and /metrics admit whoever presents
	// the token, from any address (the page through a login session).
	// Without it they answer only loopback clients that address the server
	// by a loopback name, and must not be put behind a reverse proxy.
	AdminTokenSHA256 []byte
	// Dispatcher, when set, must report Running for /readyz to answer 200;
	// an *outbox.Dispatcher does.
	Dispatcher Runner
	// Metrics is served at GET /metrics under the admin rule: metrics name
	// tools and destinations. Nil serves no /metrics. See [NewMetrics].
	Metrics http.Handler
	// Now is the clock of the page's login sessions and login limit; nil
	// means time.Now.
	Now func() time.Time
}

// A Runner reports whether a background worker is running, such as an
// *outbox.Dispatcher.
type Runner interface{ Running() bool }

var _ Runner = (*outbox.Dispatcher)(nil)

// NewHandler returns the operator surface on db as one handler with these
// routes, to be mounted at the root of a server (chi: r.Mount("/", h);
// http.ServeMux: mux.Handle("/", h)) beside the MCP endpoint:
//
//	/admin/...     the admin API (JSON; see the package doc)
//	/, /login, ... the operator page
//	GET /healthz   200 "ok" while the process serves
//	GET /readyz    200 when the database takes writes and has this
//	               binary's schema and the dispatcher runs, else 503
//	GET /metrics   Options.Metrics, under the admin rule
func NewHandler(db *schema.DB, opts *Options) http.Handler {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	auth := &adminAuth{adminHash: o.AdminTokenSHA256}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	r.Get("/readyz", (&readiness{db: db, dispatcher: o.Dispatcher}).ServeHTTP)
	r.Mount("/admin", adminRouter(db, o.Logger, auth))
	page := newPageHandler(db, o.Logger, auth)
	if o.Now != nil {
		page.now = o.Now
	}
	page.mount(r)
	if o.Metrics != nil {
		// Metrics name tools and destinations: the admin rule guards them
		// (the admin token when configured, else clients on this host).
		r.With(adminGuard(auth)).Method(http.MethodGet, "/metrics", o.Metrics)
	}
	return r
}

// readiness answers /readyz: 200 when the server can do its work: the
// database takes writes and has this binary's schema, and the dispatcher
// (if any) is delivering. Otherwise 503, with what failed, so a load
// balancer stops sending calls.
type readiness struct {
	db         *schema.DB
	dispatcher Runner
}

func (rd *readiness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	checks := map[string]string{"database": "ok", "dispatcher": "ok"}
	ready := true
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := rd.db.CheckReady(ctx); err != nil {
		checks["database"], ready = err.Error(), false
	}
	if rd.dispatcher != nil && !rd.dispatcher.Running() {
		checks["dispatcher"], ready = "not running", false
	}
	w.Header().Set("Content-Type", "application/json")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": ready, "checks": checks})
}
