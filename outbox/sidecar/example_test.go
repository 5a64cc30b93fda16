package sidecar_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/sidecar"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// memoryUpstream dials a go-sdk server in this process; a real sidecar
// dials a process ([sidecar.Command]) or a URL ([sidecar.HTTP]).
type memoryUpstream struct{ server *mcp.Server }

func (u memoryUpstream) Dial(ctx context.Context) (mcp.Connection, error) {
	st, ct := mcp.NewInMemoryTransports()
	if _, err := u.server.Connect(ctx, st, nil); err != nil {
		return nil, err
	}
	return ct.Connect(ctx)
}

func (memoryUpstream) String() string { return "in-memory upstream" }

// A tool server that knows nothing of the outbox, behind the sidecar: a
// client's retry with the same key is replayed by the sidecar and never
// reaches the upstream.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sidecar-example")
	defer os.RemoveAll(dir)
	db, err := schema.Open(ctx, filepath.Join(dir, "sidecar.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	layer, err := outbox.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	// The reaper and the task runner until Stop, and a dispatcher: with
	// no destinations, as this server enqueues no effects, so that an
	// Enqueue added later without its destination fails at once.
	running, err := layer.Start(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer running.Stop(context.WithoutCancel(ctx)) // before db.Close: defers run last in, first out

	// The upstream: any MCP server; here one tool that counts its runs.
	var runs atomic.Int64
	upstream := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "v0"}, nil)
	mcp.AddTool(upstream, &mcp.Tool{Name: "send"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("sent (run %d)", runs.Add(1))}}}, nil, nil
	})

	p, err := sidecar.New(sidecar.Options{Layer: layer, Upstream: memoryUpstream{upstream}})
	if err != nil {
		log.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	conn, err := st.Connect(ctx)
	if err != nil {
		log.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, conn) }()

	client := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "v0"}, nil)
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "send", Arguments: map[string]any{}, Meta: mcp.Meta{"idempotencyKey": "send-1"}})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Content[0].(*mcp.TextContent).Text)
	}
	cs.Close()
	<-served
	fmt.Println("upstream runs:", runs.Load())
	// Output:
	// sent (run 1)
	// sent (run 1)
	// upstream runs: 1
}
