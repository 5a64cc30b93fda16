package operator_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
	"github.com/mcp-outbox/mcp-outbox/outbox/operator"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The whole operator surface under /ops/ on a plain http.ServeMux, beside
// the MCP endpoint; without an admin token it answers clients on this host
// only, except for the health checks.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "operator-example")
	defer os.RemoveAll(dir)
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ops, err := operator.NewHandler(ctx, db, &operator.Options{BasePath: "/ops/"})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	// mux.Handle("/mcp", mcphttp.NewHandler(server, nil))
	mux.Handle("/ops/", ops)

	for _, c := range []struct{ path, remote string }{
		{"/ops/healthz", "192.0.2.7:40000"},
		{"/ops/admin/summary", "127.0.0.1:50123"},
		{"/ops/admin/summary", "192.0.2.7:40000"},
		{"/ops/", "127.0.0.1:50123"},
	} {
		req := httptest.NewRequest(http.MethodGet, c.path, nil)
		req.RemoteAddr, req.Host = c.remote, "127.0.0.1:8080"
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Printf("%s from %s: %d\n", c.path, c.remote, rec.Code)
	}
	// Output:
	// /ops/healthz from 192.0.2.7:40000: 200
	// /ops/admin/summary from 127.0.0.1:50123: 200
	// /ops/admin/summary from 192.0.2.7:40000: 403
	// /ops/ from 127.0.0.1:50123: 200
}

// Each part where you like: health checks at the root for the load
// balancer, metrics at /metrics with the layer's own counters, the admin
// API and the page under /internal/ behind the admin token.
func Example_separate() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "operator-example")
	defer os.RemoveAll(dir)
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	reg := prometheus.NewRegistry()
	metrics := outbox.NewMetrics(reg) // for outbox.Options and dispatch.Options
	_ = metrics
	// The 32 bytes of the admin token's SHA-256, from the hex that
	// 'mcp-outbox token hash' prints (bearer.Hash).
	token, err := bearer.ParseHash("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
	if err != nil {
		log.Fatal(err)
	}

	page, err := operator.NewPage(ctx, db, &operator.Options{BasePath: "/internal/ops/", AdminTokenSHA256: token})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	health := operator.NewHealth(db, nil)
	mux.Handle("GET /healthz", health)
	mux.Handle("GET /readyz", health)
	mux.Handle("GET /metrics", operator.NewMetricsHandler(db, &operator.Options{Registry: reg, AdminTokenSHA256: token}))
	mux.Handle("/internal/admin/", operator.NewAdmin(db, &operator.Options{BasePath: "/internal/admin/", AdminTokenSHA256: token}))
	mux.Handle("/internal/ops/", page)

	for _, path := range []string{"/readyz", "/metrics", "/internal/admin/summary", "/internal/ops/"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(strings.TrimSpace(fmt.Sprint(path, " ", rec.Code, " ", rec.Header().Get("Location"))))
	}
	// Output:
	// /readyz 200
	// /metrics 401
	// /internal/admin/summary 401
	// /internal/ops/ 303 /internal/ops/login
}

// Operators with OAuth access tokens, from the issuer /mcp trusts: scope
// ops:read reads, ops:act acts. A request without a token is refused from
// any address, this host's included, and told where to get one.
func Example_oAuth() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "operator-example")
	defer os.RemoveAll(dir)
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	rs, err := oauth.New("https://idp.example.com", "https://mcp.example.com/mcp", nil)
	if err != nil {
		log.Fatal(err)
	}
	ops, err := operator.NewHandler(ctx, db, &operator.Options{BasePath: "/ops/", OAuth: &operator.OAuth{
		Verify:              rs.Verify,
		ReadScope:           "ops:read",
		ActScope:            "ops:act",
		ResourceMetadataURL: rs.MetadataURL(),
	}})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	// mux.Handle("/mcp", rs.Require(mcphttp.NewHandler(server, nil))), and rs.MetadataPaths()
	mux.Handle("/ops/", ops)

	req := httptest.NewRequest(http.MethodPost, "/ops/admin/effects/retry-dead", nil)
	req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("WWW-Authenticate"))
	// Output:
	// 401 Bearer realm="mcp-outbox admin", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp", scope="ops:act"
}
