package operator

import (
	"context"
	"net/http"

	"github.com/mcp-outbox/mcp-outbox/schema"
)

// NewHandler mounts the whole operator surface on one handler, at
// Options.BasePath (B):
//
//	B healthz, B readyz   NewHealth
//	B metrics             NewMetricsHandler
//	B admin/...           NewAdmin
//	B ...                 NewPage
//
// It is a convenience: to put each part where you like, or leave one out,
// use the constructors themselves.
func NewHandler(ctx context.Context, db *schema.DB, opts *Options) (http.Handler, error) {
	o, err := options(opts)
	if err != nil {
		return nil, err
	}
	page, err := NewPage(ctx, db, &o)
	if err != nil {
		return nil, err
	}
	admin := o
	admin.BasePath = o.BasePath + "admin/"
	mux := http.NewServeMux()
	mux.Handle(o.BasePath+"admin/", NewAdmin(db, &admin))
	mux.Handle(o.BasePath+"metrics", NewMetricsHandler(db, &o))
	mux.Handle(o.BasePath+"healthz", NewHealth(db, &o))
	mux.Handle(o.BasePath+"readyz", NewHealth(db, &o))
	mux.Handle(o.BasePath, page)
	return stripAware(o.BasePath, mux), nil
}
