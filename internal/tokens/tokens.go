// Package tokens makes and checks what a bearer token names: a new random
// token (mcp-outbox token new) and the principal a tokens file may give it.
// Package bearer reads tokens files with it; the command makes tokens.
package tokens

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"regexp"
)

// principalPattern keeps principals to what the token file and
// MCP_OUTBOX_TOKENS can carry unambiguously (no spaces, '=' or ',') and what
// reads well in logs and in the calls table.
var principalPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$`)

// PrincipalRule says what ValidPrincipal accepts, for error messages.
const PrincipalRule = "want 1 to 128 letters, digits and ._@:- starting with a letter or digit"

// ValidPrincipal reports whether p can name a principal: see PrincipalRule.
func ValidPrincipal(p string) bool { return principalPattern.MatchString(p) }

// NewToken returns a new random token: 32 bytes, base64url.
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random bytes: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
