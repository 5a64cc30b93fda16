package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// testLayer opens a fresh proxy database in t.TempDir() and a layer on it
// with lopts (nil: the defaults); the database closes with the test.
func testLayer(t *testing.T, lopts *outbox.Options) (*schema.DB, *outbox.Layer) {
	t.Helper()
	db, err := schema.Open(context.Background(), filepath.Join(t.TempDir(), "proxy.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	layer, err := outbox.New(db, lopts)
	if err != nil {
		t.Fatal(err)
	}
	return db, layer
}

// testProxy is a proxy on its own database; it closes with the test.
type testProxy struct {
	*Proxy
	db *schema.DB
}

// newTestProxy makes a proxy with opts on a fresh layer with lopts: the
// test's logger and a millisecond's backoff unless opts set them.
func newTestProxy(t *testing.T, lopts *outbox.Options, opts Options) *testProxy {
	t.Helper()
	db, layer := testLayer(t, lopts)
	opts.Layer = layer
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = time.Millisecond
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &testProxy{Proxy: p, db: db}
}

// serveConn serves one in-memory connection and returns its client's end;
// stop, also run at the test's end, ends Serve and returns once the
// session is over, failing the test on Serve's error.
func (p *testProxy) serveConn(t *testing.T) (client mcp.Transport, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ct, pt := mcp.NewInMemoryTransports()
	pconn, err := pt.Connect(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, pconn) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return ct, stop
}

// connect serves one in-memory connection and returns a go-sdk client
// session over it, closed at the test's end.
func (p *testProxy) connect(t *testing.T) *mcp.ClientSession {
	t.Helper()
	ct, stop := p.serveConn(t)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		stop()
	})
	return cs
}

// serveHTTP serves the proxy's Streamable HTTP on 127.0.0.1, each bearer
// token its own principal, until the test's end, and returns its URL.
func (p *testProxy) serveHTTP(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: token, Expiration: time.Now().Add(time.Hour)}, nil
	}
	srv := httptest.NewServer(auth.RequireBearerToken(verify, nil)(p.HTTPHandler(ctx)))
	t.Cleanup(func() {
		cancel()
		srv.Close()
	})
	return srv.URL
}
