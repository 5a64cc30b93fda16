package sealing

import (
	"context"
	"testing"
)

// ring is a KeyRing that cannot be a map key: Of must not panic on it.
type ring struct{ ids []string }

func (r ring) Current() string                                                { return r.ids[0] }
func (r ring) Has(string) bool                                                { return true }
func (r ring) Wrap(context.Context, string, []byte, []byte) ([]byte, error)   { return nil, nil }
func (r ring) Unwrap(context.Context, string, []byte, []byte) ([]byte, error) { return nil, nil }

// TestOf: everything given one ring shares one Sealer (one cache of data
// keys, so a KMS is asked once per principal and process); no ring is
// encryption off; a ring that cannot be a map key still gets a Sealer.
func TestOf(t *testing.T) {
	if Of(nil) != nil {
		t.Error("Of(nil) is not nil: encryption would read as on")
	}
	a, b := &ring{ids: []string{"k1"}}, &ring{ids: []string{"k1"}}
	if first, again := Of(a), Of(a); first != again {
		t.Error("one ring, two Sealers: the data-key cache is not shared")
	}
	if Of(a) == Of(b) {
		t.Error("two rings share a Sealer")
	}
	if v := (ring{ids: []string{"k1"}}); Of(v) == nil || Of(v).Ring() == nil {
		t.Error("a ring of a type that cannot be a map key got no Sealer")
	}
}
