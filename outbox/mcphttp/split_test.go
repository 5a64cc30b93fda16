package mcphttp

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestOptionsSplit: a bound given to the one of NewHandler and ServeWith
// that does not read it is not in force; that is logged once, naming the
// field, and nothing is logged when both got the same Options.
func TestOptionsSplit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		handler, server Options
		want            string // in the warning; "" for none
	}{
		{"ConnBoundToHandler", Options{BodyTimeout: 2 * time.Second}, Options{}, "fields=[BodyTimeout]"},
		{"HandlerBoundToServer", Options{}, Options{MaxInFlightPerPrincipal: 2}, "fields=[MaxInFlightPerPrincipal]"},
		{"Same", Options{BodyTimeout: 2 * time.Second, MaxDepth: 10}, Options{BodyTimeout: 2 * time.Second, MaxDepth: 10}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			logger := slog.New(slog.NewTextHandler(&logs, nil))
			tc.handler.Logger, tc.server.Logger = logger, logger
			h := NewHandler(mcp.NewServer(&mcp.Implementation{Name: "t", Version: "v0"}, nil), &tc.handler)
			addr := serveLimits(t, h, &tc.server)
			for range 2 {
				resp, err := http.Post("http://"+addr+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			got := logs.String()
			if n := strings.Count(got, "level=WARN msg=\"mcphttp: Options given to"); (tc.want == "" && n != 0) || (tc.want != "" && (n != 1 || !strings.Contains(got, tc.want))) {
				t.Fatalf("log %q: want %d warning(s) naming %q", got, min(len(tc.want), 1), tc.want)
			}
		})
	}
}

// TestOptionsSplit_NoNewHandler: ServeWith given NewHandler's bounds, and
// serving a handler of its own, says when it returns that they were not
// in force.
func TestOptionsSplit_NoNewHandler(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ServeWith(ctx, ln, http.NotFoundHandler(), &Options{MaxDepth: 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	}()
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := logs.String(); !strings.Contains(got, "no handler NewHandler made served a request") || !strings.Contains(got, "fields=[MaxDepth]") {
		t.Fatalf("log %q: want a warning that MaxDepth was not in force", got)
	}
}
