package bearer

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/authhdr"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/clientaddr"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/guesslimit"
)

// RequireOptions configure [Require].
type RequireOptions struct {
	// ResourceMetadataURL is the absolute URL of the resource's RFC 9728
	// metadata, sent as resource_metadata in every challenge so that an MCP
	// client can find the authorization server. Empty sends none (static
	// tokens have no authorization server to point to).
	ResourceMetadataURL string
	// Realm is sent as realm in every challenge; empty sends none.
	Realm string
	// Scopes are required of every request: a valid token without all of
	// them gets 403 insufficient_scope. Every challenge names them.
	Scopes []string
	// Logger gets the count of refused tokens (see [Require]); nil means
	// slog.Default(), so that guessing is never silent.
	Logger *slog.Logger

	now func() time.Time // the guess limit's clock, for tests; nil: time.Now
}

// A Refusal is a verifier's reason to refuse a token that is safe to tell
// the client (as error_description): a fixed phrase such as "token
// expired", never a part of the token, a claim's value or a key. It wraps
// auth.ErrInvalidToken.
type Refusal string

func (r Refusal) Error() string { return string(r) }

// Unwrap makes a Refusal an auth.ErrInvalidToken.
func (r Refusal) Unwrap() error { return auth.ErrInvalidToken }

type verifiedKey struct{}

// Require returns middleware that admits a request only with a bearer
// token verify accepts, and answers as RFC 6750 and the MCP authorization
// spec want otherwise:
//   - no token (or another scheme): 401 with a challenge naming the
//     resource metadata, and no error;
//   - a malformed bearer Authorization header: 400 invalid_request;
//   - a token verify refuses: 401 invalid_token;
//   - a token without opts.Scopes: 403 insufficient_scope with the scopes;
//   - from a client address whose tokens were refused
//     guesslimit.MaxTokenFailures (20) times within a minute of the first:
//     429 with Retry-After until the minute ends, the token not looked at,
//     unless verify accepted it within the last hour (and it has not
//     expired since).
//
// The limit makes guessing cost a guesser, not the server: a client past
// it costs no signature check, only a SHA-256 of its token to see whether
// it is one accepted recently. Those are verified as usual, so that
// behind a reverse proxy, whose address every client shares, a guesser
// cannot lock out the clients at work; a client's first token while its
// address is over the limit still gets 429. A real client never reaches
// the limit (an expired token is refused once, then refreshed). A
// missing token, which is how an OAuth client begins, and a verifier that
// cannot decide (503) do not count. Refusals are logged to opts.Logger as
// a count per minute, with a warning for the first clients to reach the
// limit, never a line per token; a resource with a ResourceMetadataURL is
// named "oauth tokens" in those lines, one without "bearer tokens".
//
// The go-sdk's own RequireBearerToken sends no WWW-Authenticate without
// options, answers a missing scope with 403 but no error="insufficient_scope"
// (which the go-sdk's and the TypeScript SDK's clients need for step-up
// authorization), and puts the verifier's error text in the body. A
// verifier's error reaches the client here only when it is a Refusal.
//
// An accepted request reaches h with its auth.TokenInfo where the go-sdk
// looks for it (auth.TokenInfoFromContext), which is how the outbox layer
// learns the principal.
func Require(verify auth.TokenVerifier, opts *RequireOptions) func(http.Handler) http.Handler {
	var o RequireOptions
	if opts != nil {
		o = *opts
		o.Scopes = slices.Clone(opts.Scopes)
	}
	// The MCP spec (2025-11-25) wants the scopes a client needs in the 401
	// as well, so that its first authorization asks for them.
	base := authhdr.Challenge{Realm: o.Realm, ResourceMetadata: o.ResourceMetadataURL, Scope: o.Scopes}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	surface := "bearer tokens"
	if o.ResourceMetadataURL != "" {
		surface = "oauth tokens"
	}
	guesses := guesslimit.New(guesslimit.Options{Surface: surface, Max: guesslimit.MaxTokenFailures, Logger: o.Logger, Now: o.now})
	return func(h http.Handler) http.Handler {
		// The go-sdk keeps its TokenInfo under an unexported context key:
		// only its own middleware can put it there. It runs after ours and
		// hands on what we verified, so it never sees a token we refused;
		// expiry is the verifier's to check (with its own skew), so the
		// inner check must never refuse what ours let through.
		inner := auth.RequireBearerToken(func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
			if ti, ok := ctx.Value(verifiedKey{}).(*auth.TokenInfo); ok {
				return ti, nil
			}
			return nil, auth.ErrInvalidToken
		}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true, ClockSkew: math.MaxInt64})(h)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			client := clientaddr.Of(r.RemoteAddr)
			token, present, ok := authhdr.TokenFromHeader(r.Header.Get("Authorization"))
			if wait := guesses.Blocked(client, token); wait > 0 {
				guesslimit.Refuse(w, wait)
				return
			}
			switch {
			case !present:
				authhdr.WriteChallenge(w, http.StatusUnauthorized, base)
				return
			case !ok:
				c := base
				c.Error, c.Description = "invalid_request", "want 'Authorization: Bearer TOKEN'"
				authhdr.WriteChallenge(w, http.StatusBadRequest, c)
				return
			}
			ti, err := verify(r.Context(), token, r)
			if err != nil || ti == nil {
				c := base
				var ref Refusal
				switch {
				case errors.As(err, &ref):
					c.Error, c.Description = "invalid_token", string(ref)
				case err == nil || errors.Is(err, auth.ErrInvalidToken):
					c.Error, c.Description = "invalid_token", "invalid token"
				default:
					// The verifier could not decide (the issuer unreachable,
					// say): not the client's fault, and its text may name
					// internal hosts.
					http.Error(w, "cannot verify the token now", http.StatusServiceUnavailable)
					return
				}
				guesses.Fail(client, token)
				authhdr.WriteChallenge(w, http.StatusUnauthorized, c)
				return
			}
			// Before the scopes: a token without them is no guess, and
			// past the limit it should hear 403, which says what it lacks.
			guesses.Accepted(token, ti.Expiration)
			if missing := authhdr.Missing(ti.Scopes, o.Scopes); len(missing) > 0 {
				c := base
				c.Error, c.Description = "insufficient_scope", "insufficient scope"
				authhdr.WriteChallenge(w, http.StatusForbidden, c)
				return
			}
			inner.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), verifiedKey{}, ti)))
		})
	}
}
