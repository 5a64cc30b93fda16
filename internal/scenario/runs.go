package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// call sends one tools/call for the logical charge and describes what came
// back. It does not record the attempt, so that it can run in a goroutine.
func (r *run) call(ctx context.Context, cs *mcp.ClientSession, timeout time.Duration) Attempt {
	// A new params value per attempt: the SDK may add to it while sending.
	// The arguments are the same on every attempt: that is what makes a
	// retry recognisable without a key.
	params := &mcp.CallToolParams{Name: "charge", Arguments: r.cfg.Server.ChargeArgs}
	if r.mode == LayerKey {
		params.Meta = mcp.Meta{outbox.MetaKeyIdempotency: r.key}
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	res, err := cs.CallTool(cctx, params)
	a := Attempt{Err: err, ElapsedMS: time.Since(start).Milliseconds()}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		a.Error = err.Error()
		a.What = fmt.Sprintf("client timed out after %v", timeout)
	case ConnectionClosed(err):
		a.Error = err.Error()
		a.What = "failed: the connection closed (" + err.Error() + ")"
	case err != nil:
		a.Error = err.Error()
		a.What = "failed: " + err.Error()
	case res.IsError:
		a.ToolError = textOf(res)
		a.What = "tool error: " + a.ToolError
	default:
		var out map[string]any
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			_ = d.Decode(&out)
		}
		if n, ok := out[r.cfg.Server.ChargeIDField].(json.Number); ok {
			a.ChargeID, _ = n.Int64()
		}
		if m, ok := res.Meta[outbox.MetaKeyCall].(map[string]any); ok {
			a.Replayed, _ = m["replayed"].(bool)
		}
		if a.Replayed {
			a.What = fmt.Sprintf("replayed charge #%d (the tool did not run again)", a.ChargeID)
		} else {
			a.What = fmt.Sprintf("charge #%d", a.ChargeID)
		}
	}
	r.logf("%s attempt: %s (%dms)", r.mode, a.What, a.ElapsedMS)
	return a
}

func textOf(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, " ")
}

// timeoutStdio is scenario 1: the client gives up on a charge that takes
// longer than its timeout, and retries the same call with a longer one. The
// go-sdk sends notifications/cancelled on the timeout, but without waiting
// for it, so it can reach the server after the retry.
func (r *run) timeoutStdio(ctx context.Context) error {
	cs, _, err := r.connectStdio(ctx, r.cfg.Delay)
	if err != nil {
		return err
	}
	defer cs.Close()
	r.attempts = append(r.attempts, r.call(ctx, cs, r.cfg.Timeout))
	r.attempts = append(r.attempts, r.call(ctx, cs, r.cfg.RetryTimeout))
	r.closeStdio(cs)
	return nil
}

// closeStdio closes the server's stdin and waits for it to exit, so that
// its last commit is in the file before the charges are counted.
func (r *run) closeStdio(cs *mcp.ClientSession) {
	if err := cs.Close(); err != nil {
		r.logf("stdio server exited: %v", err)
	}
}

// crash is scenario 2: the server dies (SIGKILL) while the charge is in
// progress; the client does what the spec's stdio section says, restarts
// the server and retries.
func (r *run) crash(ctx context.Context) error {
	cs, cmd, err := r.connectStdio(ctx, r.cfg.Delay)
	if err != nil {
		return err
	}
	defer cs.Close()
	first := make(chan Attempt, 1)
	ended := make(chan struct{})
	go func() {
		first <- r.call(ctx, cs, r.cfg.RetryTimeout)
		close(ended)
	}()
	// Kill at the point where it hurts: without the layer, once the charge
	// is committed; with it, once the call is claimed (its writes are then
	// in an open transaction that the kill discards).
	query := `SELECT count(*) FROM calls WHERE state = 'in_flight'`
	if r.mode == Bare {
		query = `SELECT count(*) FROM charges`
	}
	werr := waitForRow(ctx, r.db, query, ended)
	if werr == nil {
		r.logf("charge in progress: SIGKILL server (pid %d)", cmd.Process.Pid)
	}
	// Killed in every case, so that the call below returns.
	_ = cmd.Process.Kill()
	r.attempts = append(r.attempts, <-first)
	// Reaped here: a dead owner is only recognised once its pid is gone.
	_ = cs.Close()
	if werr != nil && !errors.Is(werr, errCallEnded) {
		return werr
	}

	cs2, _, err := r.connectStdio(ctx, r.cfg.Delay)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	defer cs2.Close()
	r.attempts = append(r.attempts, r.call(ctx, cs2, r.cfg.RetryTimeout))
	r.closeStdio(cs2)
	return nil
}

// statelessVersion is the first protocol version the server serves
// statelessly over HTTP.
const statelessVersion = "2026-07-28"

// timeoutHTTP is scenario 3: scenario 1 over Streamable HTTP. version ""
// lets the go-sdk client pick its default, the stateless 2026-07-28.
func (r *run) timeoutHTTP(ctx context.Context, version string) error {
	srv, err := r.startHTTP(ctx, r.cfg.Delay)
	if err != nil {
		return err
	}
	defer srv.stop()
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	// An HTTP client of its own, so that its pooled connections can be
	// closed: a connection dialled for the request that timed out may sit
	// unused in the pool, and net/http's graceful shutdown waits 5 seconds
	// for a connection that never sent a request.
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	cctx, cancel := context.WithTimeout(ctx, startTimeout)
	cs, err := newClient().Connect(cctx, &mcp.StreamableClientTransport{Endpoint: srv.url, HTTPClient: hc}, opts)
	cancel()
	if err != nil {
		return fmt.Errorf("connect to %s: %w", srv.url, err)
	}
	defer cs.Close()
	got := cs.InitializeResult().ProtocolVersion
	if version == "" && r.cfg.Server.SessionsOnly && got != "" && got < statelessVersion {
		// The client asked for its default, stateless, protocol, and the
		// server, which serves sessions only, negotiated one with a
		// session: the run goes on over that session, like scenario 3a.
		r.logf("the server serves sessions only: the client's default protocol became %s", got)
	} else if want := version; (want == "") != (got >= statelessVersion) {
		if want == "" {
			want = statelessVersion + " or later"
		}
		// The run would be reported under the wrong transport.
		return fmt.Errorf("connect to %s: negotiated protocol %s, want %s", srv.url, got, want)
	}
	r.logf("connected with protocol %s (session %q)", got, cs.ID())
	r.attempts = append(r.attempts, r.call(ctx, cs, r.cfg.Timeout))
	r.attempts = append(r.attempts, r.call(ctx, cs, r.cfg.RetryTimeout))
	if err := cs.Close(); err != nil {
		r.logf("close session: %v", err)
	}
	hc.CloseIdleConnections()
	// Stopped before the charges are counted; the deferred stop is then a
	// no-op.
	srv.stop()
	return nil
}

// frameworkRetry is scenario 4: a graph node calls charge and then fails
// with a connection error on its next step; the framework's retry policy
// re-runs the whole node, the charge included. With a key, the node uses
// one that is stable across its retries, as a checkpointed task id is.
func (r *run) frameworkRetry(ctx context.Context) error {
	cs, _, err := r.connectStdio(ctx, 0)
	if err != nil {
		return err
	}
	defer cs.Close()
	node := func(ctx context.Context, attempt int) error {
		a := r.call(ctx, cs, r.cfg.RetryTimeout)
		defer func() { r.attempts = append(r.attempts, a) }()
		switch {
		case a.Err != nil:
			return a.Err
		case a.ToolError != "":
			return errors.New(a.ToolError)
		case attempt < nodeAttempts:
			// The node's next step (say, notifying the order service)
			// loses its connection; the charge has already happened.
			a.NodeErr = errDownstream()
			a.NodeError = a.NodeErr.Error()
			a.What += ", then the node failed: " + a.NodeError
			return a.NodeErr
		}
		return nil
	}
	if err := defaultRetryPolicy().Run(ctx, node); err != nil {
		r.logf("node failed for good: %v", err)
	}
	r.closeStdio(cs)
	return nil
}
