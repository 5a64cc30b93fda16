// Package authhdr reads and writes the HTTP side of bearer authentication
// (RFC 6750) for the packages that authenticate requests: bearer, oauth
// and operator. It is internal so that those packages' APIs say what a
// user configures, not how a header is parsed.
package authhdr

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"slices"
	"strings"
)

// Challenge is one WWW-Authenticate: Bearer challenge (RFC 6750 §3).
type Challenge struct {
	Realm            string
	Error            string // invalid_request, invalid_token or insufficient_scope
	Description      string // error_description: a fixed phrase, see bearer.Refusal
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

// FromRequest returns the token of r's 'Authorization: Bearer' header.
func FromRequest(r *http.Request) (token string, ok bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	return token, true
}

// Matches reports, in constant time, whether token (white space around it
// aside) has the SHA-256 hash.
func Matches(hash []byte, token string) bool {
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(sum[:], hash) == 1
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
