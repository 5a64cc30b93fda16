package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// caller is what the load drives: a set of sessions, one per concurrent
// caller (stdio: one session shared by all of them).
type caller struct {
	sessions []*mcp.ClientSession
	stdio    *exec.Cmd // the stdio server process, started by the SDK's CommandTransport
}

func (c *caller) close() {
	for _, cs := range c.sessions {
		cs.Close()
	}
}

// connectHTTP opens one session per caller, spread round-robin over urls
// as a load balancer would. A stateful session asks for 2025-11-25; a
// stateless one takes the client's default, the newest.
func connectHTTP(ctx context.Context, urls []string, c cell) (*caller, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = c.clients
	hc := &http.Client{Transport: tr}
	client := mcp.NewClient(&mcp.Implementation{Name: "outbox-load", Version: "v0"}, nil)
	var opts *mcp.ClientSessionOptions
	if c.transport == httpStateful {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"}
	}
	res := &caller{}
	for i := range c.clients {
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: urls[i%len(urls)], HTTPClient: hc, MaxRetries: -1}, opts)
		if err != nil {
			res.close()
			return nil, fmt.Errorf("connect: %w", err)
		}
		if (c.transport == httpStateful) != (cs.ID() != "") {
			res.close()
			cs.Close()
			return nil, fmt.Errorf("connect: %s asked, but the session id is %q", c.transport, cs.ID())
		}
		res.sessions = append(res.sessions, cs)
	}
	return res, nil
}

// connectStdio starts cmd through the SDK's CommandTransport, as a desktop
// client starts a stdio server, and shares its one session among the
// callers.
func connectStdio(ctx context.Context, cmd *exec.Cmd, c cell) (*caller, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "outbox-load", Version: "v0"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, fmt.Errorf("connect over stdio: %w", err)
	}
	res := &caller{stdio: cmd}
	for range c.clients {
		res.sessions = append(res.sessions, cs)
	}
	return res, nil
}

// amounts makes keyless calls distinct: the layer recognises a keyless
// call by its tool and arguments for a while (the fingerprint window), and
// a load of identical charges would measure replays instead of charges.
var amounts atomic.Int64

// load has every caller call charge, one call at a time each, for d.
// Errors are counted; the first is returned when no call succeeded.
func load(ctx context.Context, c *caller, keyed, replay bool, d time.Duration) (calls, errs int, lat []time.Duration, err error) {
	deadline := time.Now().Add(d)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
	)
	for i, cs := range c.sessions {
		wg.Go(func() {
			var mine []time.Duration
			bad := 0
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				p := &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"amount": 100}}
				if replay {
					p.Meta = mcp.Meta{"idempotencyKey": fmt.Sprintf("replay-%d-%d", i, n%replayKeys)}
				} else if keyed {
					p.Meta = mcp.Meta{"idempotencyKey": newKey()}
				} else {
					p.Arguments = map[string]any{"amount": amounts.Add(1)}
				}
				t0 := time.Now()
				res, cerr := cs.CallTool(ctx, p)
				took := time.Since(t0)
				if cerr != nil || res.IsError {
					bad++
					mu.Lock()
					if firstErr == nil {
						firstErr = cerr
						if cerr == nil {
							firstErr = fmt.Errorf("tool error: %v", res.Content)
						}
					}
					mu.Unlock()
					continue
				}
				mine = append(mine, took)
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(lat) == 0 && firstErr != nil {
		return 0, errs, nil, firstErr
	}
	return len(lat), errs, lat, ctx.Err()
}

// replayKeys is how many keys each caller of a replay cell cycles through.
const replayKeys = 16

func newKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "load-" + hex.EncodeToString(b[:])
}
