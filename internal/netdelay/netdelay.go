// Package netdelay is a TCP proxy that puts a network between a client and
// a server on one machine: every byte is held for a fixed one-way delay
// (plus jitter) in each direction, and the proxy counts round trips, the
// client's bursts of bytes that got an answer. Loopback has no latency of
// its own, so a store's cost in round trips, which decides a call's
// latency once the database is across a network, is invisible without it.
//
// The proxy is meant for benchmarks and fault harnesses: it passes bytes
// through unchanged and understands no protocol.
package netdelay

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a Proxy. The zero value passes bytes through at once.
type Options struct {
	// Delay is the one-way delay added in each direction: a round trip
	// through the proxy takes at least twice this.
	Delay time.Duration
	// Jitter, if not zero, adds a uniformly random extra delay in
	// [0, Jitter) to each chunk of bytes. Bytes never overtake each other:
	// a chunk leaves no earlier than the one before it.
	Jitter time.Duration
}

// Proxy forwards connections accepted on its address to a target.
type Proxy struct {
	ln     net.Listener
	target string
	opts   Options

	roundTrips atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on 127.0.0.1 (a free port) and forwards every connection to
// target (host:port).
func Start(target string, opts *Options) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	if opts != nil {
		p.opts = *opts
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// RoundTrips counts, over all connections so far, the bursts of bytes from
// a client that the server answered: a client that sends several messages
// before it reads (a pipeline) costs one, as it does on a real network.
func (p *Proxy) RoundTrips() int64 { return p.roundTrips.Load() }

// Close stops accepting, cuts every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	// asked: the client sent bytes that the server has not answered yet.
	var asked atomic.Bool
	done := make(chan struct{}, 2)
	go func() {
		p.pipe(server, client, func() { asked.Store(true) })
		done <- struct{}{}
	}()
	go func() {
		p.pipe(client, server, func() {
			if asked.CompareAndSwap(true, false) {
				p.roundTrips.Add(1)
			}
		})
		done <- struct{}{}
	}()
	<-done // either side gone: cut both, which ends the other pipe
	_ = client.Close()
	_ = server.Close()
	<-done
}

// chunk is bytes read at one time, due to be written at another.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, holding each chunk until its due time. read runs
// when a chunk arrives from src, before it is delayed.
func (p *Proxy) pipe(dst, src net.Conn, read func()) {
	q := make(chan chunk, 1024)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		t := time.NewTimer(0)
		<-t.C
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				t.Reset(d)
				<-t.C
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = src.Close()
				for range q { // drain, so the reader never blocks
				}
				return
			}
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			read()
			due := time.Now().Add(p.delay())
			if due.Before(last) {
				due = last // bytes keep their order
			}
			last = due
			q <- chunk{b: buf[:n], due: due}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_ = dst.Close()
			}
			break
		}
	}
	close(q)
	<-wrote
}

func (p *Proxy) delay() time.Duration {
	d := p.opts.Delay
	if p.opts.Jitter > 0 {
		d += rand.N(p.opts.Jitter)
	}
	return d
}
