// Package netfault is a TCP proxy for tests that can cut a link the way a
// network partition does: [Proxy.Blackhole] drops every byte silently,
// both ways, and leaves the connections open, so that a peer's writes go
// unacknowledged and its reads wait, as when packets are dropped (no RST,
// no FIN: unlike a killed server, which the peer sees at once). New
// connections are accepted and hang the same way. [Proxy.Reset] closes
// every connection with a reset; [Proxy.Heal] passes traffic again.
//
// Dropping happens above TCP: the proxy's own sockets still acknowledge
// what the peer sends, so a peer's TCP_USER_TIMEOUT does not fire on a
// black-holed link here as it would on a real partition; its keepalive
// probes are answered too. What a test sees is a server that stopped
// answering: the bounds above the socket (statement, lock and connect
// timeouts, contexts, leases) are what it checks.
//
// The package is for tests only.
package netfault

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Proxy forwards connections from its address to a target.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	hole  bool
	conns map[net.Conn]struct{}
	// lost: connections that dropped bytes in the hole; Heal resets them.
	lost map[net.Conn]struct{}
	wake *sync.Cond // signalled when hole ends
	done bool
}

// Start listens on 127.0.0.1 and forwards to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, lost: map[net.Conn]struct{}{}}
	p.wake = sync.NewCond(&p.mu)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole drops all traffic from now on, silently.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.hole = true
	p.mu.Unlock()
}

// Heal passes traffic again. A connection that lost bytes in the hole is
// reset, as TCP ends one whose partition outlasted its retransmissions:
// TCP never delivers a stream with a gap in it, so leaving it open would
// make both peers wait for each other for ever (the fault campaign found
// exactly that: a replica waiting for an answer to a query the server never
// got, the server idle), which no real network does. Connections that lost
// nothing go on.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.hole = false
	for c := range p.lost {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
		delete(p.conns, c)
		delete(p.lost, c)
	}
	p.wake.Broadcast()
	p.mu.Unlock()
}

// Reset closes every open connection with a reset (RST).
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
		delete(p.conns, c)
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.done = true
	p.hole = false
	p.wake.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	p.Reset()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	if !p.track(client) {
		return
	}
	// A connection made during a partition hangs until it heals.
	p.mu.Lock()
	for p.hole && !p.done {
		p.wake.Wait()
	}
	p.mu.Unlock()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(server) {
		client.Close()
		return
	}
	go p.pipe(server, client)
	p.pipe(client, server)
}

// pipe copies from src to dst, dropping what it reads while the hole is
// open.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			drop := p.hole
			if drop {
				p.lost[src], p.lost[dst] = struct{}{}, struct{}{}
			}
			p.mu.Unlock()
			if !drop {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					src.Close()
					return
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) || !p.holeOpen() {
				dst.Close()
			}
			return
		}
	}
}

func (p *Proxy) holeOpen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hole
}
