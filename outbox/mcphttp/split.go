package mcphttp

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
)

// One Options type configures two functions, and each reads only its own
// fields: [ServeWith] the connection's (ShutdownTimeout, BodyTimeout,
// IdleTimeout, MaxConns, MaxConnsPerClient), [NewHandler] the request's
// (MaxInFlight, MaxInFlightPerPrincipal, MaxInFlightBytesPerPrincipal,
// MaxDepth, AllowedOrigins). A bound
// given to the other one only would be dropped quietly, so each request
// carries what ServeWith was given, and the first request that reaches a
// NewHandler compares: a field set on one side and not the same on the
// other is logged once, as a warning naming it.

// servedKey carries a *served in the contexts of ServeWith's requests.
type servedKey struct{}

// served is what ServeWith was given, and whether a NewHandler saw one of
// its requests.
type served struct {
	opts    Options
	handled atomic.Bool
}

// connFields and handlerFields name the fields each function reads, set in
// o (non-zero).
func connFields(o Options) []string {
	var f []string
	for _, x := range []struct {
		name string
		set  bool
	}{{"ShutdownTimeout", o.ShutdownTimeout != 0}, {"BodyTimeout", o.BodyTimeout != 0}, {"IdleTimeout", o.IdleTimeout != 0},
		{"MaxConns", o.MaxConns != 0}, {"MaxConnsPerClient", o.MaxConnsPerClient != 0}} {
		if x.set {
			f = append(f, x.name)
		}
	}
	return f
}

func handlerFields(o Options) []string {
	var f []string
	for _, x := range []struct {
		name string
		set  bool
	}{{"MaxInFlight", o.MaxInFlight != 0}, {"MaxInFlightPerPrincipal", o.MaxInFlightPerPrincipal != 0},
		{"MaxInFlightBytesPerPrincipal", o.MaxInFlightBytesPerPrincipal != 0}, {"MaxDepth", o.MaxDepth != 0}, {"AllowedOrigins", len(o.AllowedOrigins) > 0}} {
		if x.set {
			f = append(f, x.name)
		}
	}
	return f
}

// sameConn and sameHandler compare the fields each function reads.
func sameConn(a, b Options) bool {
	return a.ShutdownTimeout == b.ShutdownTimeout && a.BodyTimeout == b.BodyTimeout && a.IdleTimeout == b.IdleTimeout &&
		a.MaxConns == b.MaxConns && a.MaxConnsPerClient == b.MaxConnsPerClient
}

func sameHandler(a, b Options) bool {
	return a.MaxInFlight == b.MaxInFlight && a.MaxInFlightPerPrincipal == b.MaxInFlightPerPrincipal &&
		a.MaxInFlightBytesPerPrincipal == b.MaxInFlightBytesPerPrincipal && a.MaxDepth == b.MaxDepth && slices.Equal(a.AllowedOrigins, b.AllowedOrigins)
}

// checkSplit wraps NewHandler's h: at its first request it compares o
// with what ServeWith was given, if anything.
func checkSplit(o Options, logger *slog.Logger, h http.Handler) http.Handler {
	var once sync.Once
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, _ := r.Context().Value(servedKey{}).(*served)
		if s != nil {
			s.handled.Store(true)
		}
		once.Do(func() {
			if set := connFields(o); len(set) > 0 && (s == nil || !sameConn(o, s.opts)) {
				logger.Warn("mcphttp: Options given to NewHandler set bounds that only ServeWith reads, and this server "+
					"was not started by ServeWith with the same ones: they are not in force; pass the same Options to ServeWith",
					"fields", set)
			}
			if s == nil {
				return
			}
			if set := handlerFields(s.opts); len(set) > 0 && !sameHandler(o, s.opts) {
				logger.Warn("mcphttp: Options given to ServeWith set bounds that only NewHandler reads, and its handler "+
					"was given other ones: ServeWith's are not in force; pass the same Options to NewHandler", "fields", set)
			}
		})
		h.ServeHTTP(w, r)
	})
}

// withServed puts s in the context of the connections ServeWith serves.
func withServed(ctx context.Context, s *served) context.Context {
	return context.WithValue(ctx, servedKey{}, s)
}

// checkHandled is ServeWith's side, as it returns: if it was given
// NewHandler's fields and no NewHandler saw any of its requests, they were
// dropped. (Any one request proves nothing: a health check does not go
// through NewHandler.)
func (s *served) checkHandled(logger *slog.Logger) {
	if set := handlerFields(s.opts); len(set) > 0 && !s.handled.Load() {
		logger.Warn("mcphttp: Options given to ServeWith set bounds that only NewHandler reads, and no handler "+
			"NewHandler made served a request: they were not in force; give them to NewHandler", "fields", set)
	}
}
