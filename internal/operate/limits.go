package operate

import (
	"net"
	"net/netip"
	"strings"
	"time"
)

// Bounds of the operator surface, here so that the tests of
// cmd/mcp-outbox can probe them without the library exporting them.
const (
	// MaxAdminBody bounds an admin API request body; the largest
	// legitimate one is a few bytes of {"outcome": ...}.
	MaxAdminBody = 1 << 20
	// MaxPageForm bounds a page's form body in bytes; the largest form is
	// a key.
	MaxPageForm = 8 << 10
	// PageSessionTTL is how long a login session of the page lasts.
	PageSessionTTL = 12 * time.Hour
	// MaxLoginFailures wrong tokens from one client within a minute of the
	// first close the page's login to it until the minute ends.
	MaxLoginFailures = 5
	// PageUnknownCalls bounds the page's list of unknown calls.
	PageUnknownCalls = 50
)

// LoopbackHost reports whether hostport (a host, or host:port) names this
// host over loopback: localhost or a loopback address. serve uses it to
// refuse an unauthenticated listener anyone else could reach.
func LoopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
