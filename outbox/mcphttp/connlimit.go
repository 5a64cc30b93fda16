package mcphttp

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/clientaddr"
)

// DefaultMaxConns is the most [Options.MaxConns] is when zero: it is then
// half the process's limit of open files (RLIMIT_NOFILE, which Go raises
// to its hard limit at start) when that is lower, so that the other half
// stays for the database's files and connections, the dispatcher's and
// the proxy's upstreams, and a listener that refuses with 503 rather than
// failing accept with "too many open files" for everyone. 1024 open
// connections serve hundreds of clients, each holding a session's event
// stream and a few requests.
const DefaultMaxConns = 1024

// DefaultMaxConnsPerClient is the most [Options.MaxConnsPerClient] is
// when zero; it is then at most a quarter of the total bound, so that one
// address cannot take all of it (and the operator can still get in). An
// honest client stays far below: a browser opens about 6 connections to
// a server, an MCP client one event stream per session and one per
// request in flight. Behind a reverse proxy or a NAT every client counts
// as the proxy's one address: raise it or turn it off there.
const DefaultMaxConnsPerClient = 64

// Retry-After of a refused connection: connections are freed as requests
// end and idle ones close.
const refusedRetryAfter = "1"

// connLimits are ServeWith's bounds on open connections; a bound <= 0 is
// off.
type connLimits struct {
	total, perClient int
	logger           *slog.Logger
	logEvery         time.Duration // refusals are summed over it in the log
	boundLoopback    bool          // apply perClient to loopback peers too (tests)
}

// resolveConnLimits turns Options' values (0: default, negative: off) into
// connLimits' (0: off).
func resolveConnLimits(o Options) (total, perClient int) {
	total = o.MaxConns
	if total == 0 {
		total = DefaultMaxConns
		if n := openFileLimit(); n > 0 {
			total = max(min(total, n/2), 1)
		}
	}
	perClient = o.MaxConnsPerClient
	if perClient == 0 {
		perClient = DefaultMaxConnsPerClient
		if total > 0 {
			perClient = max(min(perClient, total/4), 1)
		}
	}
	return max(total, 0), max(perClient, 0)
}

// limitListener accepts a connection only within the bounds; past them it
// answers 503 itself and closes it, without the http.Server ever seeing
// it.
type limitListener struct {
	net.Listener
	connLimits

	mu      sync.Mutex
	open    int
	per     map[string]int
	refused int         // since the last log line
	timer   *time.Timer // non-nil while refusals are being summed
	closed  bool
	// linger bounds the refused connections answered in the background
	// (see refuse), which hold a file each for up to 1.5 s.
	linger chan struct{}
}

func newLimitListener(ln net.Listener, l connLimits) net.Listener {
	if l.total <= 0 && l.perClient <= 0 {
		return ln
	}
	if l.logEvery <= 0 {
		l.logEvery = time.Minute
	}
	linger := 64
	if l.total > 0 {
		linger = max(min(linger, l.total/4), 1) // within the files the total leaves
	}
	return &limitListener{Listener: ln, connLimits: l, per: map[string]int{}, linger: make(chan struct{}, linger)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientaddr.Of(c.RemoteAddr().String())
		l.mu.Lock()
		why := ""
		switch {
		case l.total > 0 && l.open >= l.total:
			why = fmt.Sprintf("this server holds at most %d open connections (mcp-outbox: --max-conns; mcphttp.Options.MaxConns)", l.total)
		case l.perClient > 0 && l.per[client] >= l.perClient && (l.boundLoopback || !isLoopback(c.RemoteAddr())):
			why = fmt.Sprintf("this server holds at most %d open connections per client address (mcp-outbox: --max-conns-per-client; mcphttp.Options.MaxConnsPerClient)", l.perClient)
		}
		if why == "" {
			l.open++
			l.per[client]++
			l.mu.Unlock()
			return &limitedConn{Conn: c, l: l, client: client}, nil
		}
		l.countRefusalLocked(why)
		l.mu.Unlock()
		l.refuse(c, why)
	}
}

func (l *limitListener) release(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.per[client]--; l.per[client] <= 0 {
		delete(l.per, client)
	}
}

// countRefusalLocked logs the first refusal at once, and the ones after it
// as one count per logEvery: a flood of connections makes two lines a
// minute, not one per connection.
func (l *limitListener) countRefusalLocked(why string) {
	if l.timer != nil {
		l.refused++
		return
	}
	l.logger.Warn("http: refusing connections past a limit with 503; further refusals are counted per "+l.logEvery.String(),
		"limit", why)
	var flush func()
	flush = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.refused == 0 || l.closed {
			l.timer = nil // the next refusal is logged at once again
			return
		}
		l.logger.Warn("http: connections refused with 503 past the connection limits",
			"refused", l.refused, "during", l.logEvery, "open", l.open, "max_conns", l.total, "max_conns_per_client", l.perClient)
		l.refused = 0
		l.timer = time.AfterFunc(l.logEvery, flush)
	}
	l.timer = time.AfterFunc(l.logEvery, flush)
}

func (l *limitListener) Close() error {
	l.mu.Lock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
		if l.refused > 0 {
			l.logger.Warn("http: connections refused with 503 past the connection limits",
				"refused", l.refused, "max_conns", l.total, "max_conns_per_client", l.perClient)
			l.refused = 0
		}
	}
	l.mu.Unlock()
	return l.Listener.Close()
}

// refuse answers c with 503 and closes it, in the background for at most
// cap(linger) connections at a time; past that, at once, so that a flood
// of refused connections holds no more files than that.
//
// In the background, the answer waits for the request's headers (a
// second at most): Go's http.Transport dials connections ahead of its
// requests, and takes an answer that comes before its request for an
// "unsolicited response", which it logs and drops. And then it is
// followed by the end of what is sent, and what else the client sent is
// read and dropped, briefly: closing a connection with data unread makes
// the kernel send a reset, which can destroy the answer before the client
// reads it (what net/http's closeWriteAndWait avoids too).
func (l *limitListener) refuse(c net.Conn, why string) {
	body := "503 Service Unavailable: " + why + "; retry later\n"
	resp := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: " + refusedRetryAfter +
		"\r\nConnection: close\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body
	// A new connection's send buffer is empty: the write does not block,
	// the deadline is for a peer that is gone already.
	answer := func() error {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, err := io.WriteString(c, resp)
		return err
	}
	select {
	case l.linger <- struct{}{}:
	default:
		_ = answer()
		c.Close()
		return
	}
	go func() {
		defer func() { <-l.linger }()
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if !readHeaders(c) {
			return // none came, or not in time: nobody to answer
		}
		if answer() != nil {
			return
		}
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}()
}

// readHeaders reads from c up to the end of a request's headers, or 8 KiB
// of them, and reports whether it got there.
func readHeaders(c net.Conn) bool {
	var buf [8 << 10]byte
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
			return true
		}
		if err != nil {
			return false
		}
	}
	return true
}

// limitedConn gives its place back once, at its first Close: before the
// close, so that a client that saw its connection end finds the place
// free.
type limitedConn struct {
	net.Conn
	l      *limitListener
	client string
	once   sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.release(c.client) })
	return c.Conn.Close()
}

// CloseWrite keeps net/http's graceful close (closeWriteAndWait) working
// through the wrapper.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// isLoopback reports whether a peer is on this host. Such a peer is not
// bounded per client: it is a reverse proxy or a service mesh's sidecar
// (Envoy connects from 127.0.0.6) that every client comes through, and
// one process's 64 connections would then bound them all. The total bound
// still applies.
func isLoopback(a net.Addr) bool {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.IsLoopback()
	}
	return false
}
