package callkey

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// How a call, its principal and its effects are named in the database, in
// logs and on the wire: what the layer writes and what the command line,
// the operator surface and the benchmarks read back.

// Header is the HTTP header of draft-ietf-httpapi-idempotency-key-header:
// where a client may send a call's key, and where the dispatcher sends an
// effect's key downstream.
const Header = "Idempotency-Key"

// HashLen is the hex length of a logged hash: 48 bits tell apart the keys
// alive at one time without giving an attacker a full digest to match.
const HashLen = 12

// HashPrefix is the first HashLen hex digits of SHA-256 over s.
func HashPrefix(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:HashLen]
}

// KeyHash is how logs, spans and operator views name a call's key without
// showing it: HashPrefix over principal, NUL, key. It is scoped by
// principal, as keys are: alice's and bob's "k1" are two calls and show as
// two hashes.
func KeyHash(principal, key string) string { return HashPrefix(principal + "\x00" + key) }

const userPrefix = "user:"

// UserPrincipal is the principal of calls authenticated as user (the
// go-sdk's TokenInfo.UserID), as the calls table stores it.
func UserPrincipal(user string) string { return userPrefix + user }

// ParsePrincipal reads a principal as an operator writes it: empty or
// "local" for the local principal, a user's name ("alice") or the stored
// form ("user:alice") for an authenticated user.
func ParsePrincipal(s string) string {
	switch {
	case s == "" || s == LocalPrincipal:
		return LocalPrincipal
	case strings.HasPrefix(s, userPrefix):
		return s
	}
	return UserPrincipal(s)
}

// EffectKey is the Idempotency-Key of a call's n-th effect (from 1). The
// call's uid is random and fixed when the call is first claimed, so the key
// is the same on every delivery attempt and after restarts, and a key reused
// after its retention window does not collide with the old call's effects.
func EffectKey(callUID string, n int) string {
	return callUID + "-" + strconv.Itoa(n)
}

// HeaderValue renders a key as the Idempotency-Key header's value: a
// Structured Field string (RFC 8941), as
// draft-ietf-httpapi-idempotency-key-header specifies.
func HeaderValue(key string) string {
	return strconv.Quote(key) // keys are printable ASCII or UTF-8 without controls
}
