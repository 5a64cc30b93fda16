package outboxtest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox/mcpstdio"
)

// RawSession speaks newline-delimited JSON-RPC to a server over pipes, the
// way a stdio client does, so tests can send what the Go client cannot.
type RawSession struct {
	tb testing.TB
	w  io.Writer
	r  *bufio.Scanner
}

// RawConnect serves s through mcpstdio.NewTransport on a pair of pipes,
// and initializes the session (protocol 2025-11-25).
func RawConnect(tb testing.TB, s *mcp.Server) *RawSession {
	tb.Helper()
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	ss, err := s.Connect(context.Background(), mcpstdio.NewTransport(&mcp.IOTransport{Reader: sr, Writer: sw}, nil), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cw.Close(); ss.Close() })
	rs := &RawSession{tb: tb, w: cw, r: bufio.NewScanner(cr)}
	rs.r.Buffer(nil, 1<<20)
	rs.Send(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`)
	rs.Read()
	rs.Send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return rs
}

// Send writes one line.
func (rs *RawSession) Send(line string) {
	rs.tb.Helper()
	if _, err := io.WriteString(rs.w, line+"\n"); err != nil {
		rs.tb.Fatal(err)
	}
}

// Read reads one line, a JSON object.
func (rs *RawSession) Read() map[string]any {
	rs.tb.Helper()
	if !rs.r.Scan() {
		rs.tb.Fatalf("read response: %v", rs.r.Err())
	}
	var m map[string]any
	if err := json.Unmarshal(rs.r.Bytes(), &m); err != nil {
		rs.tb.Fatalf("response %s: %v", rs.r.Bytes(), err)
	}
	return m
}
