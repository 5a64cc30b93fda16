package operator_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/mcp-outbox/mcp-outbox/outbox/operator"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The operator surface mounted on a plain http.ServeMux, beside the MCP
// endpoint; without an admin token it answers clients on this host only.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "operator-example")
	defer os.RemoveAll(dir)
	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	metrics, _ := operator.NewMetrics(db) // its *outbox.Metrics go to outbox.Options
	mux := http.NewServeMux()
	// mux.Handle("/mcp", mcphttp.NewHandler(server, nil))
	mux.Handle("/", operator.NewHandler(db, &operator.Options{Metrics: metrics}))

	for _, c := range []struct{ path, remote string }{
		{"/healthz", "192.0.2.7:40000"},
		{"/admin/summary", "127.0.0.1:50123"},
		{"/admin/summary", "192.0.2.7:40000"},
	} {
		req := httptest.NewRequest(http.MethodGet, c.path, nil)
		req.RemoteAddr, req.Host = c.remote, "127.0.0.1:8080"
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Printf("%s from %s: %d\n", c.path, c.remote, rec.Code)
	}
	// Output:
	// /healthz from 192.0.2.7:40000: 200
	// /admin/summary from 127.0.0.1:50123: 200
	// /admin/summary from 192.0.2.7:40000: 403
}
