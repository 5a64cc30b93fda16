package sidecar

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"

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
