package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// Encryption at rest and forgetting a principal: with a Sealer of a key
// file, what the layer records (results, effect bodies and headers, task
// arguments) is encrypted before it reaches the database, and forgetting a
// principal (mcp-outbox encryption forget-principal) erases its records for
// good while keeping its keys: a retry runs nothing and is answered "erased".
func Example_dataProtection() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	// The key file: 'ID:BASE64(32 random bytes)' lines, as
	// echo "k1:$(openssl rand -base64 32)" > keys && chmod 600 keys
	// makes one; LoadKeyFile refuses a file other users may read.
	key := make([]byte, seal.KeySize)
	if _, err := rand.Read(key); err != nil {
		log.Fatal(err)
	}
	keyFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keyFile, []byte("k1:"+base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		log.Fatal(err)
	}

	db, err := schema.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	// One Sealer for the layer; layer.Start hands it to its dispatcher.
	// A dispatcher, operator page or query of its own needs one of the
	// same key file.
	layer, err := sealedLayer(db, keyFile)
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
	server := layer.NewServer(&mcp.Implementation{Name: "payments", Version: "v1"}, nil)
	runs := 0
	outbox.AddTool(layer, server, &mcp.Tool{Name: "charge", Description: "Charge a card."},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, map[string]string, error) {
			runs++
			return nil, map[string]string{"receipt": "alice paid 42 EUR"}, nil
		}, nil)
	st, ct := mcp.NewInMemoryTransports()
	if _, err := server.Connect(ctx, st, nil); err != nil {
		log.Fatal(err)
	}
	client, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	charge := func() *mcp.CallToolResult {
		res, err := client.CallTool(ctx, &mcp.CallToolParams{
			Name: "charge", Arguments: map[string]any{}, Meta: mcp.Meta{"idempotencyKey": "charge-1"},
		})
		if err != nil {
			log.Fatal(err)
		}
		return res
	}

	fmt.Println(charge().Content[0].(*mcp.TextContent).Text)
	var stored string
	if err := db.Read.QueryRowContext(ctx, `SELECT result FROM calls WHERE key = 'charge-1'`).Scan(&stored); err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored encrypted:", sealing.IsSealed([]byte(stored)), "readable:", strings.Contains(stored, "42 EUR"))

	// The principal as an operator writes it: "local" for calls on stdio
	// or without authentication, the user's ID (TokenInfo.UserID) for
	// authenticated HTTP.
	forgotten, err := admin.ForgetPrincipal(ctx, db, "local", time.Now())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("forgotten calls:", forgotten.Calls)
	retry := charge()
	fmt.Println("retry:", retry.Meta[outbox.MetaKeyError], "runs:", runs)
	// Output:
	// {"receipt":"alice paid 42 EUR"}
	// stored encrypted: true readable: false
	// forgotten calls: 1
	// retry: erased runs: 1
}

// sealedLayer opens a layer that encrypts what it records under the keys
// of keyFile.
func sealedLayer(db *schema.DB, keyFile string) (*outbox.Layer, error) {
	ring, err := seal.LoadKeyFile(keyFile) // refuses a file other users may read
	if err != nil {
		return nil, err
	}
	return outbox.New(db, &outbox.Options{Keys: ring}) // layer.Start gives it to its dispatcher
}
