package bearer

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// noExpiry stands in for "never": the SDK's middleware refuses a TokenInfo
// without an expiration, and these tokens live until removed from the file.
var noExpiry = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// A Verifier maps bearer tokens to their principals. A nil or empty
// Verifier authenticates nothing: Require then lets every request through,
// and logs a warning saying so.
type Verifier struct {
	tokens []Token
}

// NewVerifier returns a Verifier of toks. Check them with CheckDistinct
// first: of two principals with one token, the first listed wins. Each
// Token's Hash is the 32-byte SHA-256 (ParseHash of a tokens file's hex,
// or of what Hash returns); any other length would match no token, so it
// panics, naming the principal, as a mistake in the program.
func NewVerifier(toks []Token) *Verifier {
	for _, t := range toks {
		if len(t.Hash) != sha256.Size {
			panic(fmt.Sprintf("bearer: the token of principal %q has a Hash of %d bytes, want the %d bytes of its SHA-256 "+
				"(ParseHash of the hex that Hash returns; %d bytes is that hex itself)", t.Principal, len(t.Hash), sha256.Size, 2*sha256.Size))
		}
	}
	return &Verifier{tokens: append([]Token(nil), toks...)}
}

// Enabled reports whether v has any token, that is whether Require asks
// for one.
func (v *Verifier) Enabled() bool { return v != nil && len(v.tokens) > 0 }

// Principals counts the distinct principals, for a start-up message.
func (v *Verifier) Principals() int {
	if v == nil {
		return 0
	}
	seen := map[string]bool{}
	for _, t := range v.tokens {
		seen[t.Principal] = true
	}
	return len(seen)
}

// Verify is a go-sdk auth.TokenVerifier. It compares against every
// configured hash, in constant time, so the answer's timing tells nothing
// about which entry (if any) came close.
func (v *Verifier) Verify(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	sum := sha256.Sum256([]byte(token))
	principal := ""
	for _, t := range v.tokens {
		if subtle.ConstantTimeCompare(sum[:], t.Hash) == 1 && principal == "" {
			principal = t.Principal
		}
	}
	if principal == "" {
		return nil, auth.ErrInvalidToken
	}
	return &auth.TokenInfo{UserID: principal, Expiration: noExpiry}, nil
}

// realm is the realm of static tokens' challenges.
const realm = "mcp-outbox"

// Require puts h behind the bearer tokens, when there are any: a request
// without a token gets 401 with 'WWW-Authenticate: Bearer
// realm="mcp-outbox"', one with an unknown token adds
// error="invalid_token", and a client address past the limit on refused
// tokens gets 429 (see [Require]; its log goes to slog.Default(), call
// Require with v.Verify and a Logger for another). The principal reaches
// the outbox layer as TokenInfo.UserID, which scopes keys and call_status.
func (v *Verifier) Require(h http.Handler) http.Handler {
	if !v.Enabled() {
		// Said, since it is also what an empty tokens list read from a
		// file or a variable that was not set gives.
		slog.Default().Warn("bearer: the Verifier has no tokens: every request is let through unauthenticated")
		return h
	}
	return Require(v.Verify, &RequireOptions{Realm: realm})(h)
}

// Hash returns the hex SHA-256 of token: what a tokens file line and
// serve's --admin-token-sha256 hold.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}
