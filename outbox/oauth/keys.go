package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// maxDocBytes bounds a discovery document or a JWKS.
const maxDocBytes = 1 << 20

// keyCache holds the issuer's JWKS. One fetch runs at a time (under mu):
// verifications that need keys wait for it rather than each asking the
// issuer.
type keyCache struct {
	rs *ResourceServer

	mu            sync.Mutex
	discovered    bool
	jwksURI       string // from discovery
	introspection string // introspection_endpoint from discovery, if any
	set           *jose.JSONWebKeySet
	expires       time.Time // when set must be fetched again
	lastFetch     time.Time // of the JWKS, for RefreshInterval
	lastErr       error     // of the last fetch
}

// errUnavailable says the issuer could not be asked: the token is neither
// good nor bad, so the client gets 503, not 401.
var errUnavailable = errors.New("issuer unavailable")

// lookup returns the keys that may have signed a token naming kid (all
// signing keys when kid is empty). It fetches the JWKS when the cached set
// has expired, and once per RefreshInterval when kid is unknown, which is
// how a key the issuer rotated in is picked up without a restart.
func (c *keyCache) lookup(ctx context.Context, kid string) ([]jose.JSONWebKey, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	// Fetches, failed ones included, are at least RefreshInterval apart:
	// neither made-up kids nor an issuer that is down turn each request
	// into a request to the issuer.
	mayFetch := c.lastFetch.IsZero() || now.Sub(c.lastFetch) >= c.rs.opts.RefreshInterval
	if (c.set == nil || now.After(c.expires)) && mayFetch {
		// On a failed refresh a stale set still serves: the issuer
		// being down for a moment should not log everyone out.
		c.lastErr = c.fetch(ctx, now)
		mayFetch = false
	}
	if c.set == nil {
		return nil, c.lastErr
	}
	keys := c.find(kid)
	if len(keys) == 0 && mayFetch {
		if c.lastErr = c.fetch(ctx, now); c.lastErr != nil {
			return nil, c.lastErr
		}
		keys = c.find(kid)
	}
	return keys, nil
}

func (c *keyCache) find(kid string) []jose.JSONWebKey {
	var out []jose.JSONWebKey
	for _, k := range c.set.Keys {
		if (kid == "" || k.KeyID == kid) && (k.Use == "" || k.Use == "sig") {
			out = append(out, k)
		}
	}
	return out
}

// fetch discovers the JWKS URI (once) and reads the set. Holding c.mu.
func (c *keyCache) fetch(ctx context.Context, now time.Time) error {
	c.lastFetch = now
	if err := c.discoverLocked(ctx); err != nil {
		return err
	}
	var set jose.JSONWebKeySet
	h, err := c.rs.getJSON(ctx, c.jwksURI, &set)
	if err != nil {
		c.rs.opts.Logger.WarnContext(ctx, "fetch the issuer's keys", "jwks_uri", c.jwksURI, "error", err)
		return fmt.Errorf("%w: %v", errUnavailable, err)
	}
	c.set = &set
	c.expires = now.Add(maxAge(h))
	c.rs.opts.Logger.DebugContext(ctx, "fetched the issuer's keys", "jwks_uri", c.jwksURI, "keys", len(set.Keys), "until", c.expires)
	return nil
}

// discoverLocked reads the issuer's discovery document once. Holding c.mu.
func (c *keyCache) discoverLocked(ctx context.Context) error {
	if c.discovered {
		return nil
	}
	doc, err := c.rs.discover(ctx)
	if err != nil {
		c.rs.opts.Logger.WarnContext(ctx, "discover the issuer's endpoints", "issuer", c.rs.issuer, "error", err)
		return fmt.Errorf("%w: %v", errUnavailable, err)
	}
	c.jwksURI, c.introspection, c.discovered = doc.JWKSURI, doc.IntrospectionEndpoint, true
	return nil
}

// introspectionEndpoint is the issuer's RFC 7662 endpoint, by discovery.
func (c *keyCache) introspectionEndpoint(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.discoverLocked(ctx); err != nil {
		return "", err
	}
	if c.introspection == "" {
		return "", fmt.Errorf("%w: the issuer's discovery document names no introspection_endpoint", errUnavailable)
	}
	return c.introspection, nil
}

// maxAge is how long a response may be used by its Cache-Control:
// no-store and no-cache mean "ask again next time" (RefreshInterval still
// bounds how often), max-age is capped at 24 hours, and nothing at
// all means 5 minutes.
func maxAge(h http.Header) time.Duration {
	for _, d := range strings.Split(h.Get("Cache-Control"), ",") {
		name, v, _ := strings.Cut(strings.TrimSpace(strings.ToLower(d)), "=")
		switch name {
		case "no-store", "no-cache":
			return 0
		case "max-age":
			n, err := strconv.ParseInt(strings.Trim(v, `"`), 10, 64)
			if err != nil || n < 0 {
				return 0
			}
			if time.Duration(n) > maxKeysMaxAge/time.Second {
				return maxKeysMaxAge
			}
			return time.Duration(n) * time.Second
		}
	}
	return defaultKeysMaxAge
}

// discover finds the issuer's jwks_uri: RFC 8414's
// /.well-known/oauth-authorization-server first (inserted before the
// issuer's path), then OpenID Connect Discovery's openid-configuration
// (appended to it, and the RFC 8414 way). Some providers serve only the
// latter (the npm oidc-provider among them). The document must name the
// issuer exactly (RFC 8414 §3.3), or a document from elsewhere could
// substitute its own keys.
func (rs *ResourceServer) discover(ctx context.Context) (*discoveryDoc, error) {
	u, _ := url.Parse(rs.issuer) // checked by New
	path := strings.TrimSuffix(u.Path, "/")
	var tries []string
	for _, p := range []string{
		"/.well-known/oauth-authorization-server" + path,
		path + "/.well-known/openid-configuration",
		"/.well-known/openid-configuration" + path,
	} {
		v := *u
		v.Path, v.RawPath = p, ""
		if !slices.Contains(tries, v.String()) { // the last two are one for an issuer without a path
			tries = append(tries, v.String())
		}
	}
	var errs []error
	for _, try := range tries {
		var doc discoveryDoc
		if _, err := rs.getJSON(ctx, try, &doc); err != nil {
			errs = append(errs, err)
			continue
		}
		if doc.Issuer != rs.issuer {
			// Typically a trailing slash or localhost for 127.0.0.1: the
			// identifiers must be identical (RFC 8414 §3.3), so say which
			// one to configure rather than leave every token a 503.
			return nil, fmt.Errorf("%s names issuer %q, not %q: configure the issuer exactly as %q", try, doc.Issuer, rs.issuer, doc.Issuer)
		}
		for _, e := range []struct{ name, uri string }{{"jwks_uri", doc.JWKSURI}, {"introspection_endpoint", doc.IntrospectionEndpoint}} {
			if e.uri == "" && e.name != "jwks_uri" {
				continue
			}
			eu, err := url.Parse(e.uri)
			if err != nil || !eu.IsAbs() {
				return nil, fmt.Errorf("%s: %s %q is not an absolute URL", try, e.name, e.uri)
			}
			if err := checkFetchURL(eu, e.name); err != nil {
				return nil, err
			}
		}
		return &doc, nil
	}
	return nil, errors.Join(errs...)
}

// discoveryDoc is what a resource server reads of RFC 8414 metadata.
type discoveryDoc struct {
	Issuer                string `json:"issuer"`
	JWKSURI               string `json:"jwks_uri"`
	IntrospectionEndpoint string `json:"introspection_endpoint"`
}

// getJSON GETs uri into v, bounded by maxDocBytes.
func (rs *ResourceServer) getJSON(ctx context.Context, uri string, v any) (http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, uri, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := rs.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxDocBytes))
		return nil, fmt.Errorf("GET %s: %s", uri, resp.Status)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "" && !strings.HasSuffix(mt, "json") {
		return nil, fmt.Errorf("GET %s: content type %s, want JSON", uri, mt)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDocBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", uri, err)
	}
	if len(b) > maxDocBytes {
		return nil, fmt.Errorf("GET %s: larger than %d bytes", uri, maxDocBytes)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("GET %s: %w", uri, err)
	}
	return resp.Header, nil
}

// Check reaches the issuer now and reads its keys, for a start-up
// message: New does not, so that a server can start before its issuer.
// With Options.Introspection and no Endpoint, it also checks that the
// issuer names an introspection endpoint: otherwise every opaque token
// would be answered 503, with the reason in the log only.
func (rs *ResourceServer) Check(ctx context.Context) error {
	if _, err := rs.keys.lookup(ctx, ""); err != nil {
		return err
	}
	if rs.intro != nil && rs.intro.cfg.Endpoint == "" {
		if _, err := rs.keys.introspectionEndpoint(ctx); err != nil {
			return fmt.Errorf("%w (or set Introspection.Endpoint)", err)
		}
	}
	return nil
}
