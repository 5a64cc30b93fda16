package authhdr

import "testing"

func TestChallenge_Quoting(t *testing.T) {
	t.Parallel()
	got := Challenge{Realm: "a\"b\\c\r\nd"}.String()
	if want := `Bearer realm="a\"b\\c  d"`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
