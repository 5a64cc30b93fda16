package bearer

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

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

// Challenge is one WWW-Authenticate: Bearer challenge (RFC 6750 §3).
type Challenge struct {
	Realm            string
	Error            string // invalid_request, invalid_token or insufficient_scope
	Description      string // error_description: a fixed phrase, see Refusal
	Scope            []string
	ResourceMetadata string // RFC 9728 §5.1
}

// String renders c as the value of a WWW-Authenticate header.
func (c Challenge) String() string {
	var params []string
	add := func(name, v string) {
		if v != "" {
			params = append(params, name+"="+quote(v))
		}
	}
	add("realm", c.Realm)
	add("resource_metadata", c.ResourceMetadata)
	add("error", c.Error)
	add("error_description", c.Description)
	add("scope", strings.Join(c.Scope, " "))
	if len(params) == 0 {
		return "Bearer"
	}
	return "Bearer " + strings.Join(params, ", ")
}

// quote makes v a quoted-string. What goes in is configuration or a fixed
// phrase, but a quote or a control character must still not end the
// parameter early or split the header.
func quote(v string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range v {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// WriteChallenge answers status with c in WWW-Authenticate and a short
// plain-text body that repeats only c's fixed phrases.
func WriteChallenge(w http.ResponseWriter, status int, c Challenge) {
	w.Header().Set("WWW-Authenticate", c.String())
	w.Header().Set("Cache-Control", "no-store")
	msg := c.Description
	if msg == "" {
		msg = strings.ReplaceAll(c.Error, "_", " ")
	}
	if msg == "" {
		msg = "authentication required"
	}
	http.Error(w, msg, status)
}

// TokenFromHeader returns the token of an 'Authorization: Bearer TOKEN'
// header value, parsed exactly as the go-sdk's RequireBearerToken parses
// it (two fields, scheme in any case), so that a header accepted here is
// accepted there. present reports whether there was a bearer
// Authorization header at all.
//
// A header of another scheme (Basic, say) counts as absent: RFC 6750 §3.1
// wants no error code for a client that "attempted using an unsupported
// authentication method".
func TokenFromHeader(h string) (token string, present, ok bool) {
	f := strings.Fields(h)
	if len(f) == 0 || !strings.EqualFold(f[0], "bearer") {
		return "", false, false
	}
	if len(f) != 2 {
		return "", true, false
	}
	return f[1], true, true
}

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
	base := Challenge{Realm: o.Realm, ResourceMetadata: o.ResourceMetadataURL, Scope: o.Scopes}
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
			token, present, ok := TokenFromHeader(r.Header.Get("Authorization"))
			if wait := guesses.Blocked(client, token); wait > 0 {
				guesslimit.Refuse(w, wait)
				return
			}
			switch {
			case !present:
				WriteChallenge(w, http.StatusUnauthorized, base)
				return
			case !ok:
				c := base
				c.Error, c.Description = "invalid_request", "want 'Authorization: Bearer TOKEN'"
				WriteChallenge(w, http.StatusBadRequest, c)
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
				WriteChallenge(w, http.StatusUnauthorized, c)
				return
			}
			// Before the scopes: a token without them is no guess, and
			// past the limit it should hear 403, which says what it lacks.
			guesses.Accepted(token, ti.Expiration)
			if missing := Missing(ti.Scopes, o.Scopes); len(missing) > 0 {
				c := base
				c.Error, c.Description = "insufficient_scope", "insufficient scope"
				WriteChallenge(w, http.StatusForbidden, c)
				return
			}
			inner.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), verifiedKey{}, ti)))
		})
	}
}

// Missing returns the scopes of want that have does not hold.
func Missing(have, want []string) []string {
	var out []string
	for _, s := range want {
		if !slices.Contains(have, s) {
			out = append(out, s)
		}
	}
	return out
}
