package query_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/query"
)

// TestQuery_LookupArgsSealed_FreshSealer: a program that looks up a keyless
// call of an encrypted database with a key ring of its own (as a status
// endpoint beside the server would) finds it, and one without a
// Sealer is told to use one. Both used to answer not_found ("making the
// call would run it") about a call that is recorded and would replay: the
// fingerprint was computed plain, since nothing had loaded the hash key.
func TestQuery_LookupArgsSealed_FreshSealer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t)
	k := make([]byte, seal.KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keyFile, []byte("k1:"+base64.StdEncoding.EncodeToString(k)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sealer := func() seal.KeyRing {
		ring, err := seal.LoadKeyFile(keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return ring
	}
	layer, err := outbox.New(db, &outbox.Options{Keys: sealer()})
	if err != nil {
		t.Fatal(err)
	}
	server := layer.NewServer(&mcp.Implementation{Name: "notes", Version: "v1"}, nil)
	type in struct {
		Text string `json:"text"`
	}
	outbox.AddTool(layer, server, &mcp.Tool{Name: "note"},
		func(context.Context, outbox.Tx, *mcp.CallToolRequest, in) (*mcp.CallToolResult, map[string]string, error) {
			return nil, map[string]string{"ok": "yes"}, nil
		}, nil)
	st, ct := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	args := []byte(`{"text":"hello"}`)
	if res, err := client.CallTool(ctx, &mcp.CallToolParams{Name: "note", Arguments: map[string]any{"text": "hello"}}); err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}

	got, err := query.LookupArgsSealed(ctx, db, sealer(), callkey.LocalPrincipal, "note", args, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got.State != query.Completed || len(got.Result) == 0 {
		t.Errorf("with a fresh Sealer: %s %q, want completed with its result", got.State, got.Message)
	}
	got, err = query.LookupArgs(ctx, db, callkey.LocalPrincipal, "note", args, time.Now())
	if !errors.Is(err, query.ErrKeyedFingerprints) {
		t.Errorf("without a Sealer: %+v, %v; want ErrKeyedFingerprints", got, err)
	}
}
