package netfault_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/netfault"
)

// echo serves an echo server on 127.0.0.1 until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func start(t *testing.T) *netfault.Proxy {
	t.Helper()
	p, err := netfault.Start(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *netfault.Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// ping sends a line and reads it back within a bound; it returns the
// error of a read that failed or timed out.
func ping(c net.Conn, r *bufio.Reader, within time.Duration) error {
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	if err := c.SetReadDeadline(time.Now().Add(within)); err != nil {
		return err
	}
	defer c.SetReadDeadline(time.Time{})
	got, err := r.ReadString('\n')
	if err == nil && got != "ping\n" {
		return errors.New("read " + got)
	}
	return err
}

func TestDelayAndRoundTrips(t *testing.T) {
	const delay = 20 * time.Millisecond
	p := start(t)
	p.SetDelay(delay, 0)
	c, r := dial(t, p)
	for i := range 3 {
		start := time.Now()
		// Two lines in one burst: one round trip.
		if _, err := c.Write([]byte("ping\npong\n")); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"ping\n", "pong\n"} {
			got, err := r.ReadString('\n')
			if err != nil || got != want {
				t.Fatalf("read %q, %v; want %q", got, err, want)
			}
		}
		if took := time.Since(start); took < 2*delay {
			t.Errorf("round trip %d took %v, want at least %v", i, took, 2*delay)
		}
		if got := p.RoundTrips(); got != int64(i+1) {
			t.Errorf("RoundTrips() = %d after %d round trips", got, i+1)
		}
	}
}

// The slow link of the fault campaign: a delay set on a live connection
// slows it from then on, and lifting it speeds it up again, without
// reordering or losing a byte.
func TestSetDelayWhileConnected(t *testing.T) {
	p := start(t)
	c, r := dial(t, p)
	if err := ping(c, r, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	const delay, jitter = 30 * time.Millisecond, 20 * time.Millisecond
	p.SetDelay(delay, jitter)
	// Many bursts under jitter: bytes must keep their order.
	for i := range 20 {
		start := time.Now()
		if _, err := c.Write([]byte{'a' + byte(i)}); err != nil {
			t.Fatal(err)
		}
		b, err := r.ReadByte()
		if err != nil || b != 'a'+byte(i) {
			t.Fatalf("read %q, %v; want %q", b, err, 'a'+byte(i))
		}
		if took := time.Since(start); took < 2*delay {
			t.Errorf("burst %d took %v under a %v delay", i, took, delay)
		}
	}
	p.SetDelay(0, 0)
	if err := ping(c, r, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// A black hole hangs a connection (no error, no bytes), and the heal
// resets a connection that lost bytes in it, as TCP would end it; one that
// sent nothing while the hole was open goes on.
func TestBlackholeThenHeal(t *testing.T) {
	p := start(t)
	lossy, lr := dial(t, p)
	idle, ir := dial(t, p)
	for _, c := range []struct {
		c net.Conn
		r *bufio.Reader
	}{{lossy, lr}, {idle, ir}} {
		if err := ping(c.c, c.r, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	p.Blackhole()
	err := ping(lossy, lr, 200*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read through the hole ended with %v, want a hang (deadline exceeded)", err)
	}
	// A connection made during the hole hangs too.
	late, lateR := dial(t, p)
	if _, err := late.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if err := late.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := lateR.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection made in the hole answered: %v", err)
	}
	_ = late.SetReadDeadline(time.Time{})
	p.Heal()
	if err := lossy.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := lr.ReadString('\n'); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection that lost bytes was not reset at the heal: %v", err)
	}
	if err := ping(idle, ir, 5*time.Second); err != nil {
		t.Fatalf("a connection that lost nothing did not survive the hole: %v", err)
	}
	// The late connection's bytes were sent before the server was
	// dialled: they wait in the client's socket, and pass at the heal.
	if err := late.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, err := lateR.ReadString('\n'); err != nil || got != "ping\n" {
		t.Fatalf("the connection made in the hole read %q, %v after the heal", got, err)
	}
}

// Bytes held by a delay when the hole opens are lost with it, as packets
// in flight are.
func TestBlackholeDropsBytesInFlight(t *testing.T) {
	p := start(t)
	c, r := dial(t, p)
	if err := ping(c, r, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetDelay(300*time.Millisecond, 0)
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	if err := c.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("bytes in flight passed the hole: %v", err)
	}
}

func TestReset(t *testing.T) {
	p := start(t)
	c, r := dial(t, p)
	if err := ping(c, r, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadString('\n'); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Reset: %v, want the connection ended", err)
	}
	c2, r2 := dial(t, p)
	if err := ping(c2, r2, 5*time.Second); err != nil {
		t.Fatalf("a new connection after Reset: %v", err)
	}
}

func TestCloseCutsConnections(t *testing.T) {
	p, err := netfault.Start(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	c, r := dial(t, p)
	if err := ping(c, r, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read after Close succeeded")
	}
}
