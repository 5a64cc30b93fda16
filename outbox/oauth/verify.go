package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

// maxTokenBytes bounds a token: larger ones are refused before parsing.
const maxTokenBytes = 16 << 10

// principalPrefix starts every principal this package names.
const principalPrefix = "oauth:"

// Principal is the principal of a token with iss and sub, "oauth:ISS#SUB":
// both, so that a subject of one issuer is never taken for the same
// subject of another.
func Principal(iss, sub string) string { return principalPrefix + iss + "#" + sub }

// The reasons a token is refused, told to the client as error_description.
// They name the check, never a claim's value.
const (
	refMalformed   = bearer.Refusal("malformed token")
	refAlgorithm   = bearer.Refusal("token algorithm not accepted")
	refUnknownKey  = bearer.Refusal("token signed by an unknown key")
	refSignature   = bearer.Refusal("token signature invalid")
	refIssuer      = bearer.Refusal("token issued by another issuer")
	refAudience    = bearer.Refusal("token issued for another resource")
	refExpired     = bearer.Refusal("token expired")
	refNotYetValid = bearer.Refusal("token not yet valid")
	refIssuedLater = bearer.Refusal("token issued in the future")
	refNoExpiry    = bearer.Refusal("token has no expiry")
	refNoSubject   = bearer.Refusal("token has no subject")
)

// tokenClaims are the claims read besides the registered ones: RFC 9068's
// scope (a space-separated string), and scp, which some issuers use
// instead (a string or an array).
type tokenClaims struct {
	Scope    string          `json:"scope"`
	Scp      json.RawMessage `json:"scp"`
	ClientID string          `json:"client_id"`
}

func (c tokenClaims) scopes() []string {
	if c.Scope != "" {
		return strings.Fields(c.Scope)
	}
	var list []string
	if json.Unmarshal(c.Scp, &list) == nil {
		return list
	}
	var s string
	if json.Unmarshal(c.Scp, &s) == nil {
		return strings.Fields(s)
	}
	return nil
}

// Verify is a go-sdk auth.TokenVerifier for JWT access tokens (and opaque
// ones, with Options.Introspection, judged by the same rules). A token is
// accepted when its header names an allowed algorithm, it is signed by a
// key of the issuer's JWKS, its iss is the issuer, its aud holds the
// resource exactly, it has an exp and a sub, and exp, nbf and iat hold now
// within the leeway. A refusal is a bearer.Refusal (401 invalid_token); an
// error that is not (the issuer unreachable) means the token could not be
// judged.
func (rs *ResourceServer) Verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	if len(token) > maxTokenBytes {
		return nil, refMalformed
	}
	if strings.Count(token, ".") != 2 {
		if rs.intro != nil {
			return rs.intro.verify(ctx, token)
		}
		return nil, refMalformed
	}
	// The allow-list is enforced while parsing: a header naming none,
	// HS256 or anything else not listed is refused before a key is looked
	// at, so a public key can never be used as an HMAC secret.
	tok, err := jwt.ParseSigned(token, rs.algs)
	if err != nil {
		if strings.Contains(err.Error(), "algorithm") {
			return nil, refAlgorithm
		}
		return nil, refMalformed
	}
	if len(tok.Headers) != 1 {
		return nil, refMalformed
	}
	hdr := tok.Headers[0]
	keys, err := rs.keys.lookup(ctx, hdr.KeyID)
	if err != nil {
		return nil, err
	}
	var (
		claims jwt.Claims
		extra  tokenClaims
		signed bool
	)
	for _, k := range keys {
		if !usable(k, hdr.Algorithm) {
			continue
		}
		if tok.Claims(k.Key, &claims, &extra) == nil {
			signed = true
			break
		}
	}
	switch {
	case len(keys) == 0:
		return nil, refUnknownKey
	case !signed:
		return nil, refSignature
	}
	if err := claims.ValidateWithLeeway(jwt.Expected{Issuer: rs.issuer, AnyAudience: jwt.Audience{rs.Resource()}}, rs.opts.Leeway); err != nil {
		return nil, refusal(err)
	}
	switch {
	case claims.Expiry == nil:
		return nil, refNoExpiry
	case claims.Subject == "":
		return nil, refNoSubject
	}
	extraInfo := map[string]any{"iss": claims.Issuer, "sub": claims.Subject}
	if extra.ClientID != "" {
		extraInfo["client_id"] = extra.ClientID
	}
	return &auth.TokenInfo{
		UserID:     Principal(claims.Issuer, claims.Subject),
		Scopes:     extra.scopes(),
		Expiration: claims.Expiry.Time(),
		Extra:      extraInfo,
	}, nil
}

// usable: only a public key, meant for signatures, of the algorithm the
// token names (when the JWKS says which). A symmetric key in a JWKS is
// never used, whatever the token says.
func usable(k jose.JSONWebKey, alg string) bool {
	if !k.Valid() || !k.IsPublic() {
		return false
	}
	return k.Algorithm == "" || k.Algorithm == alg
}

func refusal(err error) error {
	switch {
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return refIssuer
	case errors.Is(err, jwt.ErrInvalidAudience):
		return refAudience
	case errors.Is(err, jwt.ErrExpired):
		return refExpired
	case errors.Is(err, jwt.ErrNotValidYet):
		return refNotYetValid
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return refIssuedLater
	}
	return refMalformed
}
