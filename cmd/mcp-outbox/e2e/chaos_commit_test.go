package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestChaosPostgresCommitLost: the connection breaks after PostgreSQL has
// committed a call's transaction and before the serve process has read the
// answer to its COMMIT (what the PostgreSQL soak's kills of PostgreSQL can
// do). The call is completed in the database (its charge made, its effect
// enqueued), so its attempt must not answer not_recorded, "nothing of it
// was recorded": the layer reads the call's row again and, finding its own
// outcome there, answers the result; a retry replays it.
func TestChaosPostgresCommitLost(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts PostgreSQL and a server")
	}
	target := pgtest.Database(t)
	proxy := newCommitCutProxy(t, target)
	cs, _ := serveStdio(t, bin, proxy.url, nil)
	mustSucceed(t, cs, chargeCall("k-warm", 100)) // creates the tables

	// The stored result of k-cut is a parameter of the statement that
	// records its outcome, in the transaction of its charge.
	proxy.arm([]byte(`"amount":250`))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, chargeCall("k-cut", 250))
	if err != nil {
		t.Fatal(err)
	}
	if !proxy.fired.Load() {
		t.Fatalf("the proxy never cut a COMMIT; the call answered %s", resultText(res))
	}
	db, err := sql.Open("pgx", target)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var state string
	if err := db.QueryRow(`SELECT state FROM calls WHERE key = 'k-cut'`).Scan(&state); err != nil {
		t.Fatalf("read the call: %v", err)
	}
	if n := countRows(t, db, `SELECT count(*) FROM charges WHERE amount = 250`); state != "completed" || n != 1 {
		t.Fatalf("after the cut COMMIT: call %s, %d charges; the cut should land after PostgreSQL committed", state, n)
	}
	if res.IsError {
		code, _ := res.Meta[outbox.MetaKeyError].(string)
		t.Errorf("the call is completed in the database and charged once, but its attempt was answered %s: %q", code, resultText(res))
	}
	wantReplay(t, mustSucceed(t, cs, chargeCall("k-cut", 250)), true, "meta")
}

// commitCutProxy forwards TCP connections to PostgreSQL. Once armed with
// a marker, the first connection that sends COMMIT after sending the
// marker in the same transaction is cut: the COMMIT goes through, and
// both sides are closed as soon as PostgreSQL answers it, without relaying
// the answer.
type commitCutProxy struct {
	url    string // target with the proxy's address
	to     string // PostgreSQL's host:port
	marker atomic.Pointer[[]byte]
	fired  atomic.Bool
}

// commitMsg is pgx's COMMIT of a *sql.Tx: a simple-protocol Query
// message. The layer's pipelined COMMIT (outbox/pipe_postgres.go) is
// instead the Bind of a statement pgx prepared once per connection, whose
// Parse message names it before its text, pipedCommit.
var (
	commitMsg   = []byte("Q\x00\x00\x00\x0bcommit\x00")
	pipedCommit = []byte("\x00COMMIT\x00")
)

// isCommit reports whether a chunk the client sends holds a COMMIT,
// learning from it the name of a prepared COMMIT (*prepared).
func isCommit(chunk []byte, prepared *[]byte) bool {
	if bytes.Contains(chunk, commitMsg) {
		return true
	}
	if i := bytes.Index(chunk, pipedCommit); i >= 0 {
		// The Parse message: 'P', its length, the name, the text.
		if j := bytes.LastIndex(chunk[:i], []byte("stmtcache_")); j >= 0 {
			*prepared = append([]byte(nil), chunk[j:i+1]...) // with its NUL
		}
		return false
	}
	return *prepared != nil && bytes.Contains(chunk, *prepared)
}

func newCommitCutProxy(t *testing.T, target string) *commitCutProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutProxy{to: u.Host}
	u.Host = l.Addr().String()
	p.url = u.String()
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c) })
		}
	})
	return p
}

func (p *commitCutProxy) arm(marker []byte) { p.marker.Store(&marker) }

func (p *commitCutProxy) serve(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.to)
	if err != nil {
		return
	}
	defer server.Close()
	var cutting atomic.Bool // this connection's COMMIT is on its way
	done := make(chan struct{})
	go func() {
		defer close(done)
		// PostgreSQL to the client, unless the answer is the cut COMMIT's.
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && cutting.Load() {
				p.fired.Store(true)
				client.Close()
				server.Close()
				return
			}
			if n > 0 {
				if _, err := client.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				client.Close()
				return
			}
		}
	}()
	// The client to PostgreSQL. pgx sends each message whole, in one
	// write, so matching within a read is enough here.
	sawMarker := false  // since this connection's last COMMIT
	var prepared []byte // the name of this connection's prepared COMMIT
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		chunk := buf[:n]
		if m := p.marker.Load(); m != nil && bytes.Contains(chunk, *m) {
			sawMarker = true
		}
		if isCommit(chunk, &prepared) {
			if sawMarker && !p.fired.Load() {
				cutting.Store(true) // before PostgreSQL can answer
			}
			sawMarker = false
		}
		if n > 0 {
			if _, err := server.Write(chunk); err != nil {
				break
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				server.Close()
			}
			break
		}
	}
	server.Close()
	<-done
}
