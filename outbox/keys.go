package outbox

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
)

// Names a key travels under.
const (
	// MetaKeyIdempotency is the key's name in params._meta.
	MetaKeyIdempotency = "idempotencyKey"
	// HeaderIdempotencyKey is the HTTP header of
	// draft-ietf-httpapi-idempotency-key-header.
	HeaderIdempotencyKey = callkey.Header
	// ArgumentIdempotencyKey is the tool argument looked for when the tool's
	// input schema declares it.
	ArgumentIdempotencyKey = "idempotency_key"
)

// callIdentity is who made a call and under which key.
type callIdentity struct {
	principal string
	key       string
	source    callkey.Source
	argsHash  string
	// plainHash is the plain SHA-256 args_hash when argsHash is keyed: a
	// row recorded before encryption was turned on still matches it.
	plainHash string
	// plainKey is the plain fingerprint of a call without a key when key
	// is keyed: an identical call made before encryption was turned on is
	// found under it while its window lasts (claim.go).
	plainKey string
}

// principalOf is the authenticated user of an HTTP request, else the local
// principal. The session id is deliberately not used: it does not survive a
// reconnect, and is empty on stdio and stateless HTTP.
func principalOf(req *mcp.CallToolRequest) string {
	if req.Extra != nil && req.Extra.TokenInfo != nil && req.Extra.TokenInfo.UserID != "" {
		return callkey.UserPrincipal(req.Extra.TokenInfo.UserID)
	}
	return callkey.LocalPrincipal
}

// identify finds the key of a call. It returns source "" when the call
// carries no key and fingerprints are off for the tool.
func identify(req *mcp.CallToolRequest, t *toolInfo, window bool, s *sealing.Sealer) (callIdentity, error) {
	id := callIdentity{principal: t.principalOf(req)}
	canonical, err := callkey.Canonical(req.Params.Arguments)
	if err != nil {
		return id, fmt.Errorf("arguments are not valid JSON: %w", err)
	}
	id.argsHash = callkey.SealedArgsHash(s, canonical)
	if s.Keyed() {
		id.plainHash = callkey.ArgsHash(canonical)
	}

	key, source, err := explicitKey(req, t)
	if err != nil {
		return id, err
	}
	if source != "" {
		if err := callkey.Validate(key); err != nil {
			return id, fmt.Errorf("%w (from %s)", err, sourceLabel(source))
		}
		id.key, id.source = key, source
		return id, nil
	}
	if window {
		id.key = callkey.SealedFingerprint(s, id.principal, t.name, canonical)
		if s.Keyed() {
			id.plainKey = callkey.Fingerprint(id.principal, t.name, canonical)
		}
		id.source = callkey.SourceFingerprint
	}
	return id, nil
}

// matches reports whether a row's args_hash is this call's: keyed, or
// plain for a row recorded before encryption was on.
//
// A layer without a key file cannot compute a keyed hash: a row recorded
// with encryption on (before 'outbox decrypt') matches on its key alone
// until it expires. The key names the call; the hash only catches a key
// reused for other arguments.
func (id callIdentity) matches(rowHash string) bool {
	if rowHash == id.argsHash || (id.plainHash != "" && rowHash == id.plainHash) {
		return true
	}
	return id.plainHash == "" && strings.HasPrefix(rowHash, sealing.HashPrefix)
}

func explicitKey(req *mcp.CallToolRequest, t *toolInfo) (string, callkey.Source, error) {
	meta := req.Params.Meta
	for _, c := range []struct {
		name   string
		source callkey.Source
	}{{MetaKeyIdempotency, callkey.SourceMeta}, {paramskey.MetaKey, callkey.SourceParams}} {
		if v, ok := meta[c.name]; ok && v != nil {
			s, ok := v.(string)
			if !ok {
				return "", "", fmt.Errorf("%w: %s must be a string, got %T", callkey.ErrInvalidKey, sourceLabel(c.source), v)
			}
			return s, c.source, nil
		}
	}
	if req.Extra != nil {
		if vs := req.Extra.Header.Values(HeaderIdempotencyKey); len(vs) > 0 {
			if len(vs) > 1 {
				return "", "", fmt.Errorf("%w: %d Idempotency-Key headers", callkey.ErrInvalidKey, len(vs))
			}
			return unquoteHeader(vs[0]), callkey.SourceHeader, nil
		}
	}
	if t.keyArgument && len(req.Params.Arguments) > 0 {
		var args map[string]json.RawMessage
		if json.Unmarshal(req.Params.Arguments, &args) == nil {
			if raw, ok := args[ArgumentIdempotencyKey]; ok && string(raw) != "null" {
				var s string
				if err := json.Unmarshal(raw, &s); err != nil {
					return "", "", fmt.Errorf("%w: argument %s must be a string", callkey.ErrInvalidKey, ArgumentIdempotencyKey)
				}
				return s, callkey.SourceArgument, nil
			}
		}
	}
	return "", "", nil
}

// unquoteHeader accepts the draft's Structured Field string ("abc") and the
// bare form (abc) that Stripe and most clients send.
func unquoteHeader(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(v[1 : len(v)-1])
	}
	return v
}

func sourceLabel(s callkey.Source) string {
	switch s {
	case callkey.SourceMeta:
		return "_meta." + MetaKeyIdempotency
	case callkey.SourceParams:
		return "params.idempotencyKey"
	case callkey.SourceHeader:
		return "the " + HeaderIdempotencyKey + " header"
	case callkey.SourceArgument:
		return "argument " + ArgumentIdempotencyKey
	case callkey.SourceFingerprint:
		return "fingerprint of tool and arguments"
	}
	return string(s)
}

// scopedPrincipal is principal within tenant, as the calls table stores
// it; no tenant leaves it as it is.
func scopedPrincipal(tenant, principal string) string {
	if tenant == "" {
		return principal
	}
	return "tenant:" + tenant + "/" + principal
}

// checkTenant refuses a tenant name that could not be told apart from the
// principal it scopes, or would not read well on the operator page.
func checkTenant(tenant string) error {
	if tenant == "" {
		return nil
	}
	if len(tenant) > 64 {
		return fmt.Errorf("tenant %.20q… is %d bytes; at most 64", tenant, len(tenant))
	}
	for _, c := range []byte(tenant) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return fmt.Errorf("tenant %q: want letters, digits, '.', '_' or '-'", tenant)
		}
	}
	return nil
}
