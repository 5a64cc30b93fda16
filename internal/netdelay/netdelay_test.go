package netdelay_test

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/netdelay"
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

func TestProxy(t *testing.T) {
	const delay = 20 * time.Millisecond
	p, err := netdelay.Start(echo(t), &netdelay.Options{Delay: delay})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
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

func TestProxyCloseCutsConnections(t *testing.T) {
	p, err := netdelay.Start(echo(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
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
