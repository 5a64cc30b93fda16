package oauth

import (
	"testing"
	"time"
)

// An answer is reused for CacheTTL, but never past the token's exp.
func TestIntrospectedUntil(t *testing.T) {
	rs, err := New("https://idp.example.com", "https://mcp.example.com/mcp",
		&Options{Introspection: &Introspection{ClientID: "rs", ClientSecret: "s", CacheTTL: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, tc := range []struct {
		exp  time.Time
		want time.Time
	}{
		{now.Add(10 * time.Second), now.Add(10 * time.Second)},
		{now.Add(2 * time.Hour), now.Add(time.Hour)},
	} {
		exp := float64(tc.exp.Unix())
		c := rs.intro.judge(&introspectionAnswer{Active: true, ClientID: "c", Audience: []byte(`"https://mcp.example.com/mcp"`), Expiry: &exp}, now)
		if c.info == nil {
			t.Fatalf("refused: %s", c.ref)
		}
		if d := c.until.Sub(tc.want); d < -time.Second || d > time.Second {
			t.Errorf("exp %v: cached until %v, want %v", tc.exp, c.until, tc.want)
		}
	}
}
