package operator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/authhdr"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/clientaddr"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/guesslimit"
)

// adminRealm is the realm of the operator surface's challenges.
const adminRealm = "mcp-outbox admin"

// access is what a request does: read (a view, the metrics, a lookup) or
// act (retry, cancel, resolve, settle).
type access int

const (
	accessRead access = iota
	accessAct
)

// adminAuth is the operator's credential: the SHA-256 of the admin token,
// and OAuth access tokens with Options.OAuth. A nil *adminAuth, or one
// with neither, admits loopback clients only (checkAdminClient).
type adminAuth struct {
	adminHash []byte
	oauth     *OAuth // nil without Options.OAuth
	// guesses counts the wrong tokens, in the header and the page's login
	// form alike (Options.guesses).
	guesses *guesslimit.Limiter
}

func newAdminAuth(o Options) *adminAuth {
	return &adminAuth{adminHash: o.AdminTokenSHA256, oauth: o.OAuth, guesses: o.guesses}
}

// guessClient is whom r's failed authentications count against.
func guessClient(r *http.Request) string { return clientaddr.Of(r.RemoteAddr) }

// tooManyGuesses is the refusal of a client past the limit on wrong
// tokens, nil when token (from the header or the login form) may be
// looked at: the client is under the limit, or token was accepted
// recently (accepted). The limiter knows tokens by their exact text, so
// this, guessed and accepted trim them as authhdr.Matches does: the
// header's and the login form's copies of one token are one token.
func (c *adminAuth) tooManyGuesses(r *http.Request, token string) *operatorRefusal {
	if c == nil || c.guesses == nil {
		return nil
	}
	wait := c.guesses.Blocked(guessClient(r), strings.TrimSpace(token))
	if wait <= 0 {
		return nil
	}
	secs := guesslimit.Seconds(wait)
	return &operatorRefusal{status: http.StatusTooManyRequests, retryAfter: secs, msg: guesslimit.Message(secs)}
}

// guessed counts a wrong token of r's client.
func (c *adminAuth) guessed(r *http.Request, token string) {
	if c != nil && c.guesses != nil {
		c.guesses.Fail(guessClient(r), strings.TrimSpace(token))
	}
}

// accepted records a token that proved itself, the admin token or an
// OAuth token (until its expiry), so that it is still looked at while
// its client address is over the limit: behind a reverse proxy that
// address is every client's, a guesser's too.
func (c *adminAuth) accepted(token string, expiry time.Time) {
	if c != nil && c.guesses != nil {
		c.guesses.Accepted(strings.TrimSpace(token), expiry)
	}
}

// tokenRequired reports whether an admin token is configured.
func (c *adminAuth) tokenRequired() bool { return c != nil && c.adminHash != nil }

// isAdminToken reports whether token is the admin token, for the bearer
// header and the operator page's login form alike.
func (c *adminAuth) isAdminToken(token string) bool {
	return c.tokenRequired() && authhdr.Matches(c.adminHash, token)
}

// operatorRefusal is why a request may not use the operator surface: the
// status, the challenge (nil: no WWW-Authenticate) and a message for the
// body.
type operatorRefusal struct {
	status    int
	challenge *authhdr.Challenge
	msg       string
	// noCredential: the request carried neither the admin token nor an
	// OAuth token to judge (the page sends a browser to its login form
	// then, as it did before OAuth).
	noCredential bool
	// retryAfter, in seconds, when not zero: a client past the limit on
	// wrong tokens.
	retryAfter int
}

func (f *operatorRefusal) writeHeader(w http.ResponseWriter) {
	if f.challenge != nil {
		w.Header().Set("WWW-Authenticate", f.challenge.String())
	}
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
}

// Who did it, for the log of every action: "admin token", "loopback",
// "session" (the page's login), or an OAuth token's principal.
const (
	byAdminToken = "admin token"
	byLoopback   = "loopback"
	bySession    = "session"
)

// check decides whether r may do what need says. In order:
//
//   - a bearer token that is the admin token admits anything;
//   - with Options.OAuth, any other bearer token is an OAuth access token:
//     refused (401 invalid_token), or without the scope need asks for
//     (403 insufficient_scope), or admitted as its principal, from any
//     address;
//   - with an admin token or OAuth configured, nothing else is admitted
//     (401);
//   - with neither, the loopback rule (checkAdminClient).
//
// With an admin token or OAuth, a client past the limit on wrong tokens
// (Options.guesses) gets 429 first, its token unchecked, unless the token
// was accepted within the last hour (an OAuth token: and has not expired
// since), which is then judged as usual; each bearer token that is
// neither the admin token nor an accepted OAuth token counts against it.
// A missing token does not: it is how a browser or an OAuth client
// begins.
//
// OAuth turns the loopback rule off. Its premise, that only clients on
// this host reach the listener, is what a TLS-terminating proxy on the
// same host breaks, and servers behind an identity provider are the ones
// that sit behind such proxies: a tokenless request through one would
// look local and be admitted to everything.
func (c *adminAuth) check(r *http.Request, need access) (by string, refused *operatorRefusal) {
	header := r.Header.Get("Authorization")
	oauth := c != nil && c.oauth != nil
	if oauth || c.tokenRequired() {
		token, _ := authhdr.FromRequest(r)
		if f := c.tooManyGuesses(r, token); f != nil {
			return "", f
		}
	}
	if oauth {
		token, present, ok := authhdr.TokenFromHeader(header)
		switch {
		case present && !ok:
			return "", c.refuse(http.StatusBadRequest, need, "invalid_request", "want 'Authorization: Bearer TOKEN'")
		case present && c.isAdminToken(token):
			c.accepted(token, time.Time{})
			return byAdminToken, nil
		case present:
			return c.checkOAuth(r, token, need)
		}
	} else if c.tokenRequired() {
		token, ok := authhdr.FromRequest(r)
		if ok && c.isAdminToken(token) {
			c.accepted(token, time.Time{})
			return byAdminToken, nil
		}
		if ok {
			c.guessed(r, token)
		}
	}
	if c.tokenRequired() || oauth {
		// With OAuth a bearer token was judged above, so what is left here
		// is no credential, as without OAuth any other header is.
		f := c.refuse(http.StatusUnauthorized, need, "", "")
		f.noCredential = true
		switch {
		case oauth && c.tokenRequired():
			f.msg = fmt.Sprintf("the operator surface requires 'Authorization: Bearer' with the admin token or an OAuth access token with scope %s", c.oauth.scope(need))
		case oauth:
			f.msg = fmt.Sprintf("the operator surface requires 'Authorization: Bearer' with an OAuth access token with scope %s, from any address (with OAuth, loopback clients need one too); "+
				"a browser logs in to the page with the admin token, when one is configured", c.oauth.scope(need))
		default:
			f.msg = "the admin API requires 'Authorization: Bearer' with the admin token"
		}
		return "", f
	}
	if err := checkAdminClient(r); err != nil {
		return "", &operatorRefusal{status: http.StatusForbidden, msg: err.Error()}
	}
	return byLoopback, nil
}

// checkOAuth judges an OAuth access token, as bearer.Require does for
// /mcp.
func (c *adminAuth) checkOAuth(r *http.Request, token string, need access) (string, *operatorRefusal) {
	ti, err := c.oauth.Verify(r.Context(), token, r)
	if err != nil || ti == nil {
		var ref bearer.Refusal
		switch {
		case errors.As(err, &ref):
			c.guessed(r, token)
			return "", c.refuse(http.StatusUnauthorized, need, "invalid_token", string(ref))
		case err == nil || errors.Is(err, auth.ErrInvalidToken):
			c.guessed(r, token)
			return "", c.refuse(http.StatusUnauthorized, need, "invalid_token", "invalid token")
		}
		// The issuer unreachable, say: not the client's fault, and the
		// error may name internal hosts.
		return "", &operatorRefusal{status: http.StatusServiceUnavailable, msg: "cannot verify the token now"}
	}
	c.accepted(token, ti.Expiration)
	if !c.oauth.grants(ti.Scopes, need) {
		f := c.refuse(http.StatusForbidden, need, "insufficient_scope", "insufficient scope")
		f.msg = fmt.Sprintf("insufficient scope: this needs %s", c.oauth.scope(need))
		return "", f
	}
	return ti.UserID, nil
}

// refuse builds a refusal with a challenge: the realm, and with OAuth the
// resource metadata and the scope need asks for.
func (c *adminAuth) refuse(status int, need access, code, desc string) *operatorRefusal {
	ch := &authhdr.Challenge{Realm: adminRealm, Error: code, Description: desc}
	if c != nil && c.oauth != nil {
		ch.ResourceMetadata = c.oauth.ResourceMetadataURL
		ch.Scope = []string{c.oauth.scope(need)}
	}
	msg := desc
	if msg == "" {
		msg = "authentication required"
	}
	return &operatorRefusal{status: status, challenge: ch, msg: msg}
}

// OAuth admits OAuth 2.1 access tokens to the admin API, the metrics and
// the operator page (in the Authorization header), by scope: the views
// need ReadScope, the actions ActScope, which grants the views too (every
// action answers with the state it changed).
type OAuth struct {
	// Verify judges a token: (*oauth.ResourceServer).Verify, so that an
	// operator's token is verified as /mcp's are (issuer, audience,
	// expiry, signature). Required.
	Verify auth.TokenVerifier
	// ReadScope is needed to read: the admin API's GETs, the metrics, the
	// page and its lookup. Required.
	ReadScope string
	// ActScope is needed to act: the admin API's POSTs and the page's
	// buttons. Required; it may be the same as ReadScope.
	ActScope string
	// ResourceMetadataURL is named in challenges (resource_metadata), so a
	// client finds the authorization server:
	// (*oauth.ResourceServer).MetadataURL(). Empty names none.
	ResourceMetadataURL string
}

func (o *OAuth) scope(need access) string {
	if need == accessAct {
		return o.ActScope
	}
	return o.ReadScope
}

func (o *OAuth) grants(have []string, need access) bool {
	if slices.Contains(have, o.ActScope) {
		return true
	}
	return need == accessRead && slices.Contains(have, o.ReadScope)
}

// checkOAuthOptions refuses an OAuth that could not admit anyone as
// documented: a missing verifier or scope would otherwise fail only when
// an operator needs it.
func checkOAuthOptions(o *OAuth) error {
	switch {
	case o.Verify == nil:
		return errors.New("operator: OAuth.Verify is nil: set it to (*oauth.ResourceServer).Verify")
	case o.ReadScope == "" || o.ActScope == "":
		return fmt.Errorf("operator: OAuth needs ReadScope and ActScope (they may be equal), got %q and %q", o.ReadScope, o.ActScope)
	}
	for _, s := range []string{o.ReadScope, o.ActScope} {
		for _, r := range s {
			if r < 0x21 || r > 0x7e || r == '"' || r == '\\' {
				return fmt.Errorf("operator: OAuth scope %q: want printable ASCII without spaces, quotes or backslashes", s)
			}
		}
	}
	return nil
}

type operatorKey struct{}

// withOperator records who the request is from, for the action logs.
func withOperator(r *http.Request, by string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), operatorKey{}, by))
}

// operatorOf is who a request admitted by check is from.
func operatorOf(r *http.Request) string {
	by, _ := r.Context().Value(operatorKey{}).(string)
	return by
}
