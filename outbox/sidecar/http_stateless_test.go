package sidecar

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/outboxtest"
)

// TestMuxClient_DroppedNotes: a stateless listen whose client reads none of
// its notifications loses those past the buffer without blocking the
// upstream's writer, and the loss is logged once for the listen, with the
// count, when it ends.
func TestMuxClient_DroppedNotes(t *testing.T) {
	t.Parallel()
	log := &outboxtest.LogBuffer{}
	c := &muxClient{ctx: context.Background(), in: make(chan jsonrpc.Message, 1), waiting: map[int64]*muxWaiter{}, logger: log.Logger()}
	id, w := c.open()
	params, err := json.Marshal(map[string]any{"_meta": map[string]any{mcp.MetaKeySubscriptionID: id}})
	if err != nil {
		t.Fatal(err)
	}
	const sent = 100
	for range sent {
		if err := c.Write(context.Background(), &jsonrpc.Request{Method: "notifications/message", Params: params}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := len(w.notes), cap(w.notes); got != want {
		t.Fatalf("buffered %d notes, want %d", got, want)
	}
	if log.String() != "" {
		t.Fatalf("logged before the listen ended: %s", log.String())
	}
	c.close(id)
	recs := log.Records(t, droppedNotesMsg)
	if len(recs) != 1 || strings.Count(log.String(), "\n") != 1 {
		t.Fatalf("logged %d records of the loss, want one for the listen:\n%s", len(recs), log.String())
	}
	if got, want := recs[0]["dropped"], float64(sent-cap(w.notes)); recs[0]["level"] != "WARN" || got != want {
		t.Errorf("log = %v, want a WARN with dropped=%v", recs[0], want)
	}

	// A listen whose client kept up logs nothing.
	id, _ = c.open()
	c.close(id)
	if n := strings.Count(log.String(), "\n"); n != 1 {
		t.Errorf("a listen that lost nothing logged:\n%s", log.String())
	}
}
