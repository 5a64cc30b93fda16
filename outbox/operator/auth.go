package operator

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

// adminAuth is the operator's credential: the SHA-256 of the admin token.
// A nil *adminAuth, or one without a hash, admits loopback clients only
// (checkAdminClient).
type adminAuth struct {
	adminHash []byte
}

// checkAdminToken reports whether r carries the admin token.
func (c *adminAuth) checkAdminToken(r *http.Request) bool {
	token, ok := bearer.FromRequest(r)
	return ok && c.isAdminToken(token)
}

// isAdminToken reports whether token is the admin token, for the bearer
// header and the operator page's login form alike.
func (c *adminAuth) isAdminToken(token string) bool {
	return bearer.Matches(c.adminHash, token)
}

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
