// Package netfault is a TCP proxy for tests that puts a network, and its
// faults, between a client and a server on one machine. One proxy per link
// does every link fault, and each can change while connections are open:
//
//   - [Proxy.SetDelay] holds every chunk of bytes for a one-way delay
//     (plus jitter) in each direction. Loopback has no latency of its own,
//     so a store's cost in round trips, which decides a call's latency once
//     the database is across a network, is invisible without it;
//     [Proxy.RoundTrips] counts them.
//   - [Proxy.Blackhole] drops every byte silently, both ways, and leaves
//     the connections open, so that a peer's writes go unacknowledged and
//     its reads wait, as when packets are dropped (no RST, no FIN: unlike
//     a killed server, which the peer sees at once). New connections are
//     accepted and hang the same way. Bytes already held by a delay when
//     the hole opens are dropped too, as packets in flight are.
//   - [Proxy.Reset] closes every connection with a reset.
//   - [Proxy.Heal] passes traffic again.
//
// Dropping happens above TCP: the proxy's own sockets still acknowledge
// what the peer sends, so a peer's TCP_USER_TIMEOUT does not fire on a
// black-holed link here as it would on a real partition; its keepalive
// probes are answered too. What a test sees is a server that stopped
// answering: the bounds above the socket (statement, lock and connect
// timeouts, contexts, leases) are what it checks.
//
// The proxy passes bytes through unchanged and understands no protocol.
// The package is for tests and benchmarks only.
package netfault

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from its address to a target.
type Proxy struct {
	ln     net.Listener
	target string

	roundTrips atomic.Int64

	mu            sync.Mutex
	delay, jitter time.Duration
	hole          bool
	conns         map[net.Conn]struct{}
	// lost: connections that dropped bytes in the hole; Heal resets them.
	lost map[net.Conn]struct{}
	wake *sync.Cond // signalled when hole ends
	done bool
	wg   sync.WaitGroup
}

// Start listens on 127.0.0.1 (a free port) and forwards every connection
// to target (host:port), passing traffic at once until told otherwise.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, lost: map[net.Conn]struct{}{}}
	p.wake = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay holds each chunk of bytes read from now on for d plus a
// uniformly random extra in [0, jitter), in each direction: a round trip
// takes at least 2d. Bytes never overtake each other: a chunk leaves no
// earlier than the one before it, so a drop in the delay takes effect as
// the chunks held under the old one drain. SetDelay(0, 0) passes bytes at
// once again.
func (p *Proxy) SetDelay(d, jitter time.Duration) {
	p.mu.Lock()
	p.delay, p.jitter = d, jitter
	p.mu.Unlock()
}

// RoundTrips counts, over all connections so far, the bursts of bytes from
// a client that the server answered: a client that sends several messages
// before it reads (a pipeline) costs one, as it does on a real network.
func (p *Proxy) RoundTrips() int64 { return p.roundTrips.Load() }

// Blackhole drops all traffic from now on, silently.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.hole = true
	p.mu.Unlock()
}

// Heal passes traffic again (at the delay set, if any). A connection that
// lost bytes in the hole is reset, as TCP ends one whose partition
// outlasted its retransmissions: TCP never delivers a stream with a gap in
// it, so leaving it open would make both peers wait for each other for
// ever (the fault campaign found exactly that: a replica waiting for an
// answer to a query the server never got, the server idle), which no real
// network does. Connections that lost nothing go on.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.hole = false
	for c := range p.lost {
		reset(c)
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
		reset(c)
		delete(p.conns, c)
		delete(p.lost, c)
	}
}

// Close stops accepting, cuts every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.done = true
	p.hole = false
	p.wake.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	p.Reset()
	p.wg.Wait()
	return err
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.lost, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	// A connection made during a partition hangs until it heals.
	p.mu.Lock()
	for p.hole && !p.done {
		p.wake.Wait()
	}
	p.mu.Unlock()
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
	<-done
	<-done
}

// chunk is bytes read at one time, due to be written at another.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, holding each chunk until its due time and
// dropping it if the hole is open when it is read or when it is due. read
// runs when a chunk arrives from src and passes.
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
			if p.dropped(src, dst) {
				continue
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = src.Close()
				for range q { // drain, so the reader never blocks
				}
				return
			}
		}
	}()
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 && !p.dropped(src, dst) {
			read()
			due := time.Now().Add(p.nextDelay())
			if due.Before(last) {
				due = last // bytes keep their order
			}
			last = due
			q <- chunk{b: buf[:n], due: due}
		}
		if err != nil {
			close(q)
			<-wrote
			switch {
			case errors.Is(err, io.EOF) && p.holeOpen():
				// The FIN is lost in the hole too: the peer hears
				// nothing until the heal resets the connection.
			case errors.Is(err, io.EOF):
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				} else {
					_ = dst.Close()
				}
			default:
				_ = dst.Close()
			}
			return
		}
	}
}

// dropped says whether the hole is open, and if so marks both ends of the
// connection as having lost bytes.
func (p *Proxy) dropped(src, dst net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole {
		p.lost[src], p.lost[dst] = struct{}{}, struct{}{}
	}
	return p.hole
}

func (p *Proxy) nextDelay() time.Duration {
	p.mu.Lock()
	d, j := p.delay, p.jitter
	p.mu.Unlock()
	if j > 0 {
		d += rand.N(j)
	}
	return d
}

func (p *Proxy) holeOpen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hole
}
