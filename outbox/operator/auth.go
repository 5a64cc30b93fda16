package operator

import (
	"net/http"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

// adminAuth is the operator's credential: the SHA-256 of the admin token.
// A nil *adminAuth, or one without a hash, admits loopback clients only
// (checkAdminClient).
type adminAuth struct {
	adminHash []byte
}

func newAdminAuth(o Options) *adminAuth { return &adminAuth{adminHash: o.AdminTokenSHA256} }

// tokenRequired reports whether an admin token is configured.
func (c *adminAuth) tokenRequired() bool { return c != nil && c.adminHash != nil }

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
