package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Command is an upstream run as a child process speaking MCP over stdio.
// Every Dial starts a new process.
type Command struct {
	Path string
	Args []string
	// Env is the child's environment; nil inherits the proxy's.
	Env []string
	// Stderr receives the child's stderr, each line prefixed with Prefix.
	Stderr io.Writer
	Prefix string
}

// Dial starts the command.
func (c *Command) Dial(ctx context.Context) (mcp.Connection, error) {
	cmd := exec.Command(c.Path, c.Args...)
	cmd.Env = c.Env
	if c.Stderr != nil {
		cmd.Stderr = &prefixWriter{w: c.Stderr, prefix: []byte(c.Prefix)}
	}
	// Closing the connection closes the child's stdin, which ends a
	// well-behaved stdio server; the transport signals it after a grace.
	t := &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	conn, err := t.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", c, err)
	}
	return conn, nil
}

func (c *Command) String() string { return strings.Join(append([]string{c.Path}, c.Args...), " ") }

// prefixWriter writes each line with a prefix, so that the upstream's
// stderr can be told from the proxy's own logs.
type prefixWriter struct {
	mu      sync.Mutex
	w       io.Writer
	prefix  []byte
	partial []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		line := append(append([]byte{}, p.prefix...), p.partial[:i+1]...)
		p.partial = p.partial[i+1:]
		if _, err := p.w.Write(line); err != nil {
			return len(b), nil // the child must not fail on our stderr
		}
	}
	return len(b), nil
}

// HTTP is an upstream served over Streamable HTTP. Every Dial opens a new
// MCP session.
type HTTP struct {
	URL string
	// Client makes the requests; nil means http.DefaultClient's transport.
	Client *http.Client
}

// Dial prepares a connection; the session starts with the initialize that
// goes through it.
//
// The go-sdk's client connection learns the negotiated protocol version
// (for the Mcp-Protocol-Version header) only from its own client session,
// which the proxy does not use: the version is read off the initialize
// answer here and added to every later request. Without the go-sdk session
// no standalone SSE stream is opened either, so the upstream's messages
// that are not tied to a request (list_changed, say) do not reach the
// client over an HTTP upstream.
func (h *HTTP) Dial(ctx context.Context) (mcp.Connection, error) {
	base := http.DefaultTransport
	if h.Client != nil && h.Client.Transport != nil {
		base = h.Client.Transport
	}
	rt := &versionTransport{base: base}
	t := &mcp.StreamableClientTransport{Endpoint: h.URL, HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true}
	conn, err := t.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", h.URL, err)
	}
	return &versionConn{Connection: conn, rt: rt}, nil
}

func (h *HTTP) String() string { return h.URL }

type versionTransport struct {
	base    http.RoundTripper
	version atomic.Value // string
}

func (t *versionTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if v, _ := t.version.Load().(string); v != "" && r.Header.Get("Mcp-Protocol-Version") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("Mcp-Protocol-Version", v)
	}
	return t.base.RoundTrip(r)
}

type versionConn struct {
	mcp.Connection
	rt *versionTransport
}

func (c *versionConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if resp, ok := msg.(*jsonrpc.Response); ok && resp.Error == nil && c.rt.version.Load() == nil {
		var init struct {
			ProtocolVersion string          `json:"protocolVersion"`
			ServerInfo      json.RawMessage `json:"serverInfo"`
		}
		if json.Unmarshal(resp.Result, &init) == nil && init.ProtocolVersion != "" && init.ServerInfo != nil {
			c.rt.version.Store(init.ProtocolVersion)
		}
	}
	return msg, err
}
