package oauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

// defaultIntrospectionCacheTTL is how long an introspection's answer is
// reused when Introspection.CacheTTL is zero. A revoked token keeps
// working here for at most this long.
const defaultIntrospectionCacheTTL = 30 * time.Second

// maxIntrospectionCache bounds the cached answers: past it the cache is
// emptied, so a flood of made-up tokens costs memory once, not forever.
const maxIntrospectionCache = 10000

// Introspection configures RFC 7662 token introspection, for issuers that
// hand out opaque access tokens. A token that is not a JWT is then asked
// about at the issuer's introspection endpoint, as this resource server's
// own client; JWTs are still verified locally.
type Introspection struct {
	// Endpoint is the introspection endpoint. Empty means the issuer's
	// introspection_endpoint from its discovery document.
	Endpoint string
	// ClientID and ClientSecret authenticate this resource server at the
	// endpoint (client_secret_basic). Required.
	ClientID, ClientSecret string
	// CacheTTL is how long an answer is reused, never past the token's
	// exp; zero means 30 s, negative no cache.
	CacheTTL time.Duration
}

// introspector asks the endpoint and caches the answers by the token's
// SHA-256 (a memory dump then holds no token).
type introspector struct {
	rs  *ResourceServer
	cfg Introspection

	mu    sync.Mutex
	cache map[[sha256.Size]byte]introspected
}

type introspected struct {
	info  *auth.TokenInfo // nil: refused with ref
	ref   bearer.Refusal
	until time.Time
}

// introspectionAnswer is RFC 7662 §2.2's response, the members read here.
type introspectionAnswer struct {
	Active    bool            `json:"active"`
	Scope     string          `json:"scope"`
	ClientID  string          `json:"client_id"`
	Subject   string          `json:"sub"`
	Issuer    string          `json:"iss"`
	Audience  json.RawMessage `json:"aud"`
	Expiry    *float64        `json:"exp"`
	NotBefore *float64        `json:"nbf"`
	TokenType string          `json:"token_type"`
}

func (a introspectionAnswer) audience() []string {
	var list []string
	if json.Unmarshal(a.Audience, &list) == nil {
		return list
	}
	var s string
	if json.Unmarshal(a.Audience, &s) == nil && s != "" {
		return []string{s}
	}
	return nil
}

func (in *introspector) verify(ctx context.Context, token string) (*auth.TokenInfo, error) {
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	in.mu.Lock()
	c, ok := in.cache[key]
	in.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.result()
	}
	a, err := in.ask(ctx, token)
	if err != nil {
		return nil, err
	}
	c = in.judge(a, now)
	if in.cfg.CacheTTL > 0 {
		in.mu.Lock()
		if len(in.cache) >= maxIntrospectionCache {
			clear(in.cache)
		}
		in.cache[key] = c
		in.mu.Unlock()
	}
	return c.result()
}

func (c introspected) result() (*auth.TokenInfo, error) {
	if c.info == nil {
		return nil, c.ref
	}
	ti := *c.info // the caller may change its copy
	ti.Scopes = slices.Clone(c.info.Scopes)
	return &ti, nil
}

// judge applies the same checks as to a JWT: active, the issuer (when the
// answer names one: the endpoint is the issuer's), the audience (which
// must be named: RFC 8707 holds for opaque tokens too), exp, nbf, and a
// subject, else the client the token was issued to.
func (in *introspector) judge(a *introspectionAnswer, now time.Time) introspected {
	leeway := in.rs.opts.Leeway
	refuse := func(r bearer.Refusal) introspected {
		// A refusal is cached briefly: an inactive token stays inactive.
		return introspected{ref: r, until: now.Add(in.cfg.CacheTTL)}
	}
	sub := a.Subject
	if sub == "" {
		sub = a.ClientID
	}
	switch {
	case !a.Active:
		return refuse("token not active")
	case a.Issuer != "" && a.Issuer != in.rs.issuer:
		return refuse(refIssuer)
	case !slices.Contains(a.audience(), in.rs.Resource()):
		return refuse(refAudience)
	case a.Expiry == nil:
		return refuse(refNoExpiry)
	case a.NotBefore != nil && now.Add(leeway).Before(unix(*a.NotBefore)):
		return refuse(refNotYetValid)
	case now.Add(-leeway).After(unix(*a.Expiry)):
		return refuse(refExpired)
	case sub == "":
		return refuse(refNoSubject)
	}
	exp := unix(*a.Expiry)
	until := now.Add(in.cfg.CacheTTL)
	if exp.Before(until) {
		until = exp
	}
	extra := map[string]any{"iss": in.rs.issuer, "sub": sub}
	if a.ClientID != "" {
		extra["client_id"] = a.ClientID
	}
	return introspected{info: &auth.TokenInfo{
		UserID:     Principal(in.rs.issuer, sub),
		Scopes:     strings.Fields(a.Scope),
		Expiration: exp,
		Extra:      extra,
	}, until: until}
}

func unix(sec float64) time.Time { return time.Unix(int64(sec), 0) }

// ask POSTs the token to the endpoint. An error means no answer.
func (in *introspector) ask(ctx context.Context, token string) (*introspectionAnswer, error) {
	endpoint := in.cfg.Endpoint
	if endpoint == "" {
		var err error
		if endpoint, err = in.rs.keys.introspectionEndpoint(ctx); err != nil {
			return nil, err
		}
	}
	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	// RFC 6749 §2.3.1: the client id and secret are form-encoded before
	// they go into Basic credentials.
	req.SetBasicAuth(url.QueryEscape(in.cfg.ClientID), url.QueryEscape(in.cfg.ClientSecret))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := in.rs.opts.HTTPClient.Do(req)
	if err != nil {
		in.rs.opts.Logger.WarnContext(ctx, "introspect a token", "endpoint", endpoint, "error", err)
		return nil, fmt.Errorf("%w: introspect: %v", errUnavailable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDocBytes))
	if err != nil || resp.StatusCode != http.StatusOK {
		// A 401 here is our client's credentials, not the token.
		in.rs.opts.Logger.WarnContext(ctx, "introspect a token", "endpoint", endpoint, "status", resp.Status, "error", err)
		return nil, fmt.Errorf("%w: introspect: %s", errUnavailable, resp.Status)
	}
	var a introspectionAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%w: introspect: %v", errUnavailable, err)
	}
	return &a, nil
}
