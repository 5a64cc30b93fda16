package oauth_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/mcp-outbox/mcp-outbox/outbox/oauth"
)

// FuzzAuthorization sends any Authorization header to an endpoint behind
// a ResourceServer with a real issuer: only the one token minted by the
// issuer gets through; everything else is 400 or 401 with a challenge
// naming the metadata, and no answer repeats what the header carried.
func FuzzAuthorization(f *testing.F) {
	is := newIssuer(f)
	is.addKey("k1", jose.ES256, true)
	is.addKey("k2", jose.RS256, false)
	rs, err := oauth.New(is.URL(), resource, nil)
	if err != nil {
		f.Fatal(err)
	}
	// Valid for as long as a fuzz run may last (the default claims expire
	// in 5 minutes, and the issuer's token would then be refused).
	long := is.good(resource)
	long.Expiry = jwt.NewNumericDate(time.Now().Add(24 * time.Hour))
	good := is.mint("k1", long)
	reached := 0
	h := rs.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++ }))
	parts := strings.Split(good, ".")
	for _, s := range []string{
		"", "Bearer", "Bearer ", "bearer " + good, "Bearer  " + good + " ", "Bearer " + good + " x",
		"Basic dXNlcjpwYXNz", "Bearer a.b.c", "Bearer " + parts[0] + "." + parts[1] + ".",
		"Bearer " + parts[0] + "." + parts[1] + "." + parts[2][:10],
		"Bearer " + is.mint("k2", is.good(resource)),
		"Bearer eyJhbGciOiJub25lIn0.e30.", "Bearer " + strings.Repeat("A", 20000),
		"Bearer \"quoted\\\"", "Bearer x\x00y",
	} {
		f.Add(s)
	}
	// What an answer may say: the challenge's parameter names and the
	// fixed phrases. A header field found in it proves nothing.
	// Both the answer and a header's field are scrubbed of it before the
	// field is looked for: a field made of the answer's own words and
	// punctuation ('error="invalid_token",') is found in any answer.
	vocabulary := strings.Fields(strings.Join([]string{rs.MetadataURL(), "Bearer resource_metadata error error_description invalid_token invalid_request",
		"malformed token", "token algorithm not accepted", "token signed by an unknown key", "token signature invalid",
		"token issued by another issuer", "token issued for another resource", "token expired", "token not yet valid",
		"token issued in the future", "token has no expiry", "token has no subject", "want 'Authorization: Bearer TOKEN'",
		"authentication required", "invalid token"}, " "))
	slices.SortFunc(vocabulary, func(a, b string) int { return len(b) - len(a) }) // the longest words first
	var pairs []string
	for _, w := range vocabulary {
		pairs = append(pairs, w, "\x00")
	}
	scrub := strings.NewReplacer(append(pairs, `"`, "", ",", "", "=", "", "'", "", ":", "")...).Replace
	clients := 0
	f.Fuzz(func(t *testing.T, header string) {
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		// Each input from an address of its own: from one, the refused
		// tokens would reach the guess limit (429), which
		// TestRequire_GuessLimit covers.
		clients++
		req.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:4000", clients>>16&0xff, clients>>8&0xff, clients&0xff)
		if header != "" {
			req.Header["Authorization"] = []string{header}
		}
		rec := httptest.NewRecorder()
		before := reached
		h.ServeHTTP(rec, req)
		f := strings.Fields(header)
		isGood := len(f) == 2 && strings.EqualFold(f[0], "bearer") && f[1] == good
		switch {
		case isGood && (rec.Code != 200 || reached != before+1):
			t.Fatalf("the issuer's token: %d", rec.Code)
		case !isGood && (rec.Code == 200 || reached != before):
			t.Fatalf("header %q got through: %d", header, rec.Code)
		case !isGood && rec.Code != 400 && rec.Code != 401:
			t.Fatalf("header %q: %d, want 400 or 401", header, rec.Code)
		}
		if isGood {
			return
		}
		ch := rec.Header().Get("WWW-Authenticate")
		if !strings.HasPrefix(ch, `Bearer resource_metadata="`+rs.MetadataURL()+`"`) {
			t.Fatalf("header %q: challenge %q", header, ch)
		}
		answer := scrub(ch + "\n" + rec.Body.String())
		for _, field := range f {
			if field := scrub(field); len(field) >= 8 && strings.Contains(answer, field) {
				t.Fatalf("header %q: answer %q %q repeats %q", header, ch, rec.Body.String(), field)
			}
		}
	})
}
