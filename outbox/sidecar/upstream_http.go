package sidecar

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HTTP is an upstream served over Streamable HTTP. Every Dial opens a new
// MCP session.
type HTTP struct {
	URL string
	// Client makes the requests; only its Transport is used (nil means
	// http.DefaultTransport), so whatever it adds (auth, say) goes on every
	// request, the standalone stream's GET included.
	Client *http.Client
	// Logger gets the connection's own logs (about its standalone SSE
	// stream); nil discards them.
	Logger *slog.Logger

	// minRetry and maxRetry bound the wait before reopening the standalone
	// stream; zero means the defaults.
	minRetry, maxRetry time.Duration
}

// Waits before reopening the standalone SSE stream: doubling from min to
// max while the upstream refuses it, min again after it carried something.
const (
	defaultStreamMinRetry = 500 * time.Millisecond
	defaultStreamMaxRetry = 30 * time.Second
)

// protocolNoStandalone is the first protocol version without the standalone
// SSE stream (SEP-2575): the upstream sends everything on request streams.
const protocolNoStandalone = "2026-07-28"

// Dial prepares a connection; the session starts with the initialize that
// goes through it.
//
// The go-sdk's client connection is used without the go-sdk's client
// session, which the proxy does not have, and that costs two things the
// connection does here instead. The Mcp-Protocol-Version header: the
// go-sdk learns the version from its session, so it is read off the
// initialize answer here and added to every later request. And the
// standalone SSE stream (the GET through which the upstream sends what
// belongs to no request: list_changed, resources/updated, logging, its own
// requests): the go-sdk (v1.8.0) opens it only in its connection's
// unexported sessionUpdated, which its ClientSession alone calls after
// initialize, so DisableStandaloneSSE or not, it never opens here. See
// httpConn.
func (h *HTTP) Dial(ctx context.Context) (mcp.Connection, error) {
	base := http.DefaultTransport
	if h.Client != nil && h.Client.Transport != nil {
		base = h.Client.Transport
	}
	rt := &versionTransport{base: base}
	client := &http.Client{Transport: rt}
	t := &mcp.StreamableClientTransport{Endpoint: h.URL, HTTPClient: client, DisableStandaloneSSE: true}
	conn, err := t.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", h.URL, err)
	}
	logger := h.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &httpConn{
		Connection: conn,
		rt:         rt,
		client:     client,
		url:        h.URL,
		logger:     logger.With("upstream", h.URL),
		minRetry:   cmp.Or(h.minRetry, defaultStreamMinRetry),
		maxRetry:   cmp.Or(h.maxRetry, defaultStreamMaxRetry),
		msgs:       make(chan jsonrpc.Message),
		failed:     make(chan struct{}),
		pumped:     make(chan struct{}),
	}
	c.maxRetry = max(c.maxRetry, c.minRetry)
	// Like the go-sdk's connection, this one outlives the context it was
	// made with: it ends with Close.
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go c.pump()
	return c, nil
}

func (h *HTTP) String() string { return h.URL }

// versionTransport adds the negotiated protocol version to the requests,
// and learns the session id from the answers.
type versionTransport struct {
	base    http.RoundTripper
	version atomic.Value // string
	session atomic.Pointer[string]
}

func (t *versionTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if v := t.protocolVersion(); v != "" && r.Header.Get("Mcp-Protocol-Version") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("Mcp-Protocol-Version", v)
	}
	resp, err := t.base.RoundTrip(r)
	if err == nil && resp.StatusCode/100 == 2 {
		if id := resp.Header.Get(sessionHeader); id != "" {
			t.session.CompareAndSwap(nil, &id)
		}
	}
	return resp, err
}

func (t *versionTransport) protocolVersion() string {
	v, _ := t.version.Load().(string)
	return v
}

func (t *versionTransport) sessionID() string {
	if id := t.session.Load(); id != nil {
		return *id
	}
	return ""
}

// httpConn is the go-sdk's connection to a Streamable HTTP upstream, with
// the standalone SSE stream that the go-sdk opens only for its own client
// session (see [HTTP.Dial]). Before the initialized notification goes
// under a protocol version before 2026-07-28, it opens the stream with a
// GET, as the go-sdk client does, and keeps it open until Close:
// its messages come out of Read with the answers to the POSTs, so the
// proxy passes them on like any other (the client's answers to the
// upstream's requests go back through Write, in POSTs, as the protocol
// wants).
type httpConn struct {
	mcp.Connection // the go-sdk's; the pump alone reads it
	rt             *versionTransport
	client         *http.Client
	url            string
	logger         *slog.Logger
	minRetry       time.Duration
	maxRetry       time.Duration

	ctx    context.Context // ends at Close: stops the pump and the stream
	cancel context.CancelFunc
	msgs   chan jsonrpc.Message // to Read: from the pump and from the stream

	failOnce sync.Once
	failed   chan struct{} // closed when Read has nothing more to give
	err      error         // why; set before failed is closed

	pumped chan struct{} // closed when the pump ended

	mu         sync.Mutex
	closed     bool
	streamDone chan struct{} // once the stream was started: closed when it ended

	closeOnce sync.Once
	closeErr  error
}

func (c *httpConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case msg := <-c.msgs:
		return msg, nil
	case <-c.failed:
		return nil, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *httpConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	// The stream opens before initialized goes, as the go-sdk client opens
	// it: an upstream may send a request (sampling, elicitation) the moment
	// it is initialized, and the go-sdk's and the TypeScript SDK's servers
	// drop what goes to the standalone stream while no GET holds it open.
	// Opened after, the proxy lost such requests now and then (4 of 40 in
	// a run with a TypeScript upstream). The wait is bounded, and a stream
	// the upstream refuses does not hold initialized back.
	if req, ok := msg.(*jsonrpc.Request); ok && req.Method == "notifications/initialized" {
		if opened := c.startStream(); opened != nil {
			t := time.NewTimer(streamOpenWait)
			select {
			case <-opened:
			case <-t.C:
				c.logger.Warn("the upstream's standalone SSE stream did not open in time; sending initialized all the same", "waited", streamOpenWait)
			case <-ctx.Done():
			}
			t.Stop()
		}
	}
	return c.Connection.Write(ctx, msg)
}

// streamOpenWait bounds the wait for the standalone stream's first answer
// before initialized is sent.
const streamOpenWait = 5 * time.Second

func (c *httpConn) Close() error {
	c.closeOnce.Do(func() {
		c.fail(io.EOF)
		c.mu.Lock()
		c.closed = true
		streamDone := c.streamDone
		c.mu.Unlock()
		// The stream ends before the session does: the session's end (the
		// go-sdk's DELETE) would end the stream, and it would reconnect.
		c.cancel()
		if streamDone != nil {
			<-streamDone
		}
		c.closeErr = c.Connection.Close()
		<-c.pumped
	})
	return c.closeErr
}

// fail ends Read with err, unless it ended already.
func (c *httpConn) fail(err error) {
	c.failOnce.Do(func() {
		c.err = err
		close(c.failed)
	})
}

// pump passes the go-sdk connection's messages (the answers to the POSTs,
// and what came on their SSE streams) to Read, and learns the protocol
// version from the initialize answer on the way.
func (c *httpConn) pump() {
	defer close(c.pumped)
	for {
		msg, err := c.Connection.Read(c.ctx)
		if err != nil {
			c.fail(err)
			return
		}
		c.learnVersion(msg)
		select {
		case c.msgs <- msg:
		case <-c.ctx.Done():
			return
		}
	}
}

func (c *httpConn) learnVersion(msg jsonrpc.Message) {
	resp, ok := msg.(*jsonrpc.Response)
	if !ok || resp.Error != nil || c.rt.version.Load() != nil {
		return
	}
	var init struct {
		ProtocolVersion string          `json:"protocolVersion"`
		ServerInfo      json.RawMessage `json:"serverInfo"`
	}
	if json.Unmarshal(resp.Result, &init) == nil && init.ProtocolVersion != "" && init.ServerInfo != nil {
		c.rt.version.Store(init.ProtocolVersion)
	}
}

// startStream starts the standalone stream, once, unless the protocol
// version has none. The channel it returns (nil without a stream) is
// closed once the upstream answered the first GET, whatever it answered.
func (c *httpConn) startStream() <-chan struct{} {
	if v := c.rt.protocolVersion(); v >= protocolNoStandalone {
		c.logger.Debug("no standalone SSE stream under this protocol version", "version", v)
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.streamDone != nil {
		return nil
	}
	c.streamDone = make(chan struct{})
	opened := make(chan struct{})
	go c.stream(c.streamDone, opened)
	return opened
}

// stream keeps the standalone stream open until Close: it reopens a
// dropped stream, from the last event id the upstream gave if it gave any,
// and stops for good when the upstream says it offers none.
func (c *httpConn) stream(done, firstAnswer chan struct{}) {
	defer close(done)
	answered := sync.OnceFunc(func() { close(firstAnswer) })
	defer answered()
	var lastID string
	serverRetry := time.Duration(-1) // the reconnection time the upstream set, if it did
	backoff := c.minRetry            // the wait after a failure; doubles with each
	opened := false
	for {
		wait, failed := backoff, true
		resp, err := c.get(lastID)
		answered()
		switch {
		case c.ctx.Err() != nil:
			if err == nil {
				resp.Body.Close()
			}
			return
		case err != nil:
			c.logger.Warn("open the upstream's standalone SSE stream", "error", err, "retry_in", wait)
		case resp.StatusCode/100 == 2 && isEventStream(resp):
			opened = true
			var progressed bool
			progressed, lastID, serverRetry = c.readStream(resp.Body, lastID, serverRetry)
			if c.ctx.Err() != nil {
				return
			}
			// A stream that carried something ended as streams do, and is
			// reopened after the upstream's reconnection time; one that
			// carried nothing counts as a failure, lest an upstream that
			// ends every stream at once be asked without a pause.
			if progressed {
				failed = false
				backoff = c.minRetry
				wait = backoff
				if serverRetry >= 0 {
					wait = min(serverRetry, c.maxRetry)
				}
			}
			c.logger.Debug("the upstream's standalone SSE stream ended; reopening it", "last_event_id", lastID, "retry_in", wait)
		case retryable(resp.StatusCode):
			discard(resp)
			c.logger.Warn("open the upstream's standalone SSE stream", "status", resp.Status, "retry_in", wait)
		default:
			discard(resp)
			c.refused(resp, opened)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return
		}
		if failed {
			backoff = min(2*backoff, c.maxRetry)
		}
	}
}

func (c *httpConn) get(lastID string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(c.ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, err
	}
	// The protocol version goes on through versionTransport, and what the
	// dialer's transport adds through it too.
	req.Header.Set("Accept", "text/event-stream")
	if id := c.rt.sessionID(); id != "" {
		req.Header.Set(sessionHeader, id)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	return c.client.Do(req)
}

// refused reports the upstream's refusal of the standalone stream. The
// first time, 405 (or another 4xx, as servers answer too) says that it
// offers none, which is fine. After it had one, a 404 says the session is
// gone, which ends the connection, and the proxy starts another.
func (c *httpConn) refused(resp *http.Response, opened bool) {
	switch {
	case resp.StatusCode/100 == 2:
		c.logger.Warn("the upstream's standalone SSE stream is not an event stream; going without",
			"content_type", resp.Header.Get("Content-Type"))
	case !opened:
		c.logger.Debug("the upstream offers no standalone SSE stream", "status", resp.Status)
	case resp.StatusCode == http.StatusNotFound && c.rt.sessionID() != "":
		c.logger.Warn("the upstream's session is gone (its standalone SSE stream was refused)", "status", resp.Status)
		c.fail(fmt.Errorf("reopen the standalone SSE stream: %w", mcp.ErrSessionMissing))
	default:
		c.logger.Warn("the upstream refused to reopen its standalone SSE stream; going without", "status", resp.Status)
	}
}

// readStream passes the stream's messages to Read until it ends. It
// returns whether the stream carried something (a message, or a new event
// id), the last event id, and the wait the upstream asked for.
func (c *httpConn) readStream(body io.ReadCloser, lastID string, retry time.Duration) (progressed bool, _ string, _ time.Duration) {
	defer body.Close()
	r := newSSEReader(body, maxSSEEvent)
	for {
		ev, err := r.next()
		if err != nil {
			if !errors.Is(err, io.EOF) && c.ctx.Err() == nil {
				c.logger.Debug("the upstream's standalone SSE stream broke", "error", err)
			}
			return progressed, lastID, retry
		}
		if ev.hasID && ev.id != lastID {
			lastID, progressed = ev.id, true
		}
		if ev.retry >= 0 {
			retry = ev.retry
		}
		switch {
		case ev.tooLarge:
			c.logger.Warn("skip an event of the upstream's standalone SSE stream larger than the limit", "limit", maxSSEEvent)
			continue
		case len(ev.data) == 0 || (ev.name != "" && ev.name != "message"):
			continue // a priming event (just an id), or no JSON-RPC message
		}
		msg, err := jsonrpc.DecodeMessage(ev.data)
		if err != nil {
			c.logger.Warn("skip an event of the upstream's standalone SSE stream that is no JSON-RPC message", "error", err)
			continue
		}
		progressed = true
		select {
		case c.msgs <- msg:
		case <-c.ctx.Done():
			return progressed, lastID, retry
		}
	}
}

func isEventStream(resp *http.Response) bool {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return err == nil && mt == "text/event-stream"
}

// retryable says whether a GET refused with status may succeed later.
func retryable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		// 409: the upstream may still hold the dropped stream as open.
		return true
	}
	return status >= 500
}

// discard closes resp's body, reading a little of it first so that the
// connection can serve again.
func discard(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
}
