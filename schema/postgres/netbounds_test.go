package postgres_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"golang.org/x/sys/unix"

	"github.com/mcp-outbox/mcp-outbox/internal/netfault"
	"github.com/mcp-outbox/mcp-outbox/internal/pgtest"
	"github.com/mcp-outbox/mcp-outbox/schema"
	_ "github.com/mcp-outbox/mcp-outbox/schema/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// withQuery adds settings to a URL's query.
func withQuery(u, q string) string {
	if q == "" {
		return u
	}
	if strings.Contains(u, "?") {
		return u + "&" + q
	}
	return u + "?" + q
}

// TestNetBounds_OnTheSocket: every pooled connection to PostgreSQL carries
// TCP keepalive and TCP_USER_TIMEOUT, the defaults or the URL's libpq
// settings, so that a connection into a partition fails within them
// instead of hanging a call for the kernel's ~15 minutes of retransmits.
func TestNetBounds_OnTheSocket(t *testing.T) {
	t.Parallel()
	base := pgtest.Database(t)
	for _, tc := range []struct {
		name, query   string
		userMS, idleS int
	}{
		{"Defaults", "", 20000, 10},
		{"FromTheURL", "tcp_user_timeout=3000&keepalives_idle=7&keepalives_interval=2&keepalives_count=4", 3000, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db, err := schema.Open(ctx, withQuery(base, tc.query), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			conn, err := db.Write.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var user, keep, idle int
			err = conn.Raw(func(dc any) error {
				c, ok := dc.(*stdlib.Conn).Conn().PgConn().Conn().(*net.TCPConn)
				if !ok {
					t.Fatalf("connection is %T, want *net.TCPConn", dc.(*stdlib.Conn).Conn().PgConn().Conn())
				}
				rc, err := c.SyscallConn()
				if err != nil {
					return err
				}
				var gerr error
				if err := rc.Control(func(fd uintptr) {
					user, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
					if gerr == nil {
						keep, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
					}
					if gerr == nil {
						idle, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
					}
				}); err != nil {
					return err
				}
				return gerr
			})
			if err != nil {
				t.Fatal(err)
			}
			if user != tc.userMS || keep != 1 || idle != tc.idleS {
				t.Errorf("TCP_USER_TIMEOUT %d ms, SO_KEEPALIVE %d, TCP_KEEPIDLE %d s; want %d, 1, %d", user, keep, idle, tc.userMS, tc.idleS)
			}
		})
	}
	if _, err := schema.Open(context.Background(), withQuery(base, "tcp_user_timeout=soon"), nil); err == nil {
		t.Error("tcp_user_timeout=soon: opened, want an error")
	}
}

// TestNetBounds_ReadinessWhilePartitioned: with the link to PostgreSQL
// black-holed (packets dropped, nothing reset), the readiness check fails
// within its deadline instead of hanging, and succeeds again once the link
// heals, on a new connection.
func TestNetBounds_ReadinessWhilePartitioned(t *testing.T) {
	t.Parallel()
	u := pgtest.Database(t)
	host := strings.SplitN(strings.SplitN(u, "@", 2)[1], "/", 2)[0]
	p, err := netfault.Start(host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	db, err := schema.Open(ctx, strings.Replace(u, host, p.Addr(), 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.CheckReady(ctx); err != nil {
		t.Fatalf("before the partition: %v", err)
	}
	p.Blackhole()
	const bound = 2 * time.Second
	rctx, cancel := context.WithTimeout(ctx, bound)
	start := time.Now()
	err = db.CheckReady(rctx)
	cancel()
	if took := time.Since(start); err == nil || took > bound+time.Second {
		t.Fatalf("while partitioned: %v after %v; want an error within %v", err, took, bound)
	}
	p.Heal()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, bound)
		err := db.CheckReady(rctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready 30 s after the link healed: %v", err)
		}
	}
}
