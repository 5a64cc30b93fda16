package callkey

import (
	"encoding/hex"

	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
)

// SealedFingerprint is the key of a call made without one: keyed with s's hash
// key when it has one ('fk_'), so that the key of a likely call cannot be
// computed by whoever reads the table; the plain SHA-256 otherwise,
// also when s has not loaded the hash key (sealing.Sealer.LoadHashKey), which
// would not find a call the layer recorded with one.
func SealedFingerprint(s *sealing.Sealer, principal, tool string, canonical []byte) string {
	if h := s.Hash([]byte("fingerprint"), []byte(principal), []byte(tool), canonical); h != nil {
		return "fk_" + hex.EncodeToString(h)
	}
	return Fingerprint(principal, tool, canonical)
}

// SealedArgsHash is a call's args_hash: keyed with s's hash key when it has one
// (sealing.HashPrefix), the plain SHA-256 otherwise.
func SealedArgsHash(s *sealing.Sealer, canonical []byte) string {
	if h := s.Hash([]byte("args"), canonical); h != nil {
		return sealing.HashPrefix + hex.EncodeToString(h)
	}
	return ArgsHash(canonical)
}
