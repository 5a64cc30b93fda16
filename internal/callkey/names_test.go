package callkey

import "testing"

func TestParsePrincipal(t *testing.T) {
	for in, want := range map[string]string{
		"":           LocalPrincipal,
		"local":      LocalPrincipal,
		"alice":      "user:alice",
		"user:alice": "user:alice",
		"user:local": "user:local",
	} {
		if got := ParsePrincipal(in); got != want {
			t.Errorf("ParsePrincipal(%q) = %q, want %q", in, got, want)
		}
	}
	if got := UserPrincipal("bob"); got != ParsePrincipal("bob") {
		t.Errorf("UserPrincipal(bob) = %q, ParsePrincipal(bob) = %q", got, ParsePrincipal("bob"))
	}
}

// The names are stored and compared across versions: a log's key hash must
// match what the operator page shows for the same call, and an effect's
// Idempotency-Key must not change under a destination that deduplicates
// by it.
func TestNames_Stable(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{KeyHash("local", "k1"), HashPrefix("local\x00k1")},
		{HashPrefix(""), "e3b0c44298fc"},
		{EffectKey("call_ab12", 3), "call_ab12-3"},
		{HeaderValue(`order "7"`), `"order \"7\""`},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if KeyHash("user:alice", "k1") == KeyHash("user:bob", "k1") {
		t.Error("KeyHash is not scoped by principal")
	}
}
