package oauth

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Defaults of Options' zero values.
const (
	// defaultLeeway is the clock skew allowed on exp, nbf and iat.
	defaultLeeway = 30 * time.Second
	// defaultKeysMaxAge is how long the issuer's keys are used when its
	// JWKS response says nothing about caching.
	defaultKeysMaxAge = 5 * time.Minute
	// defaultRefreshInterval is the least time between two fetches of the
	// JWKS caused by tokens naming a key the set does not hold: a stream of
	// made-up kids costs the issuer one request per interval at most.
	defaultRefreshInterval = 10 * time.Second
	// defaultHTTPTimeout bounds each request to the issuer.
	defaultHTTPTimeout = 10 * time.Second
)

// maxKeysMaxAge caps what an issuer's Cache-Control can ask for: a key the
// issuer withdraws is still accepted for at most this long.
const maxKeysMaxAge = 24 * time.Hour

// defaultAlgorithms are the JWS algorithms accepted when
// Options.Algorithms is empty: the asymmetric ones access-token issuers
// use. "none" and the HMAC algorithms can never be accepted: a resource
// server holds no shared secret, and an HMAC "signed" with the issuer's
// public key is the classic forgery.
var defaultAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.EdDSA,
}

// Options configure a [ResourceServer]. The zero value of each field is
// documented with it.
type Options struct {
	// ScopesRequired are needed for any request to the endpoint. Empty
	// requires none beyond a valid token.
	ScopesRequired []string
	// ToolScopes are needed, on top of ScopesRequired, to call a tool:
	// tool name to scopes. A tool not listed needs none. Names match
	// exactly: a misspelt one protects nothing, silently, so check them
	// with [ResourceServer.CheckTools] once the tools are registered.
	ToolScopes map[string][]string
	// ScopesSupported are advertised in the metadata. Empty advertises
	// the union of ScopesRequired and ToolScopes.
	ScopesSupported []string
	// ResourceName is the metadata's human-readable resource_name; empty
	// leaves it out.
	ResourceName string
	// Algorithms accepted in a token's header. Empty means the asymmetric
	// ones issuers use: RS256/384/512, PS256/384/512, ES256/384/512 and
	// EdDSA. "none" and HMAC algorithms are refused by New.
	Algorithms []jose.SignatureAlgorithm
	// Leeway is the clock skew allowed on exp, nbf and iat; zero means
	// 30 s, negative none.
	Leeway time.Duration
	// RefreshInterval is the least time between fetches of the JWKS for an
	// unknown kid; zero means 10 s, negative none (for tests).
	RefreshInterval time.Duration
	// Introspection, when set, accepts opaque (non-JWT) access tokens by
	// asking the issuer's RFC 7662 introspection endpoint. Nil accepts
	// JWTs only.
	Introspection *Introspection
	// HTTPClient reaches the issuer. Nil means a client with a 10 s
	// timeout and the system's trust store (which honours
	// SSL_CERT_FILE and SSL_CERT_DIR), following no redirects to another
	// host.
	HTTPClient *http.Client
	// Logger gets key refreshes and failures to reach the issuer. Nil
	// means discard.
	Logger *slog.Logger
}

// A ResourceServer verifies access tokens for one resource (the MCP
// endpoint's URL) issued by one authorization server.
type ResourceServer struct {
	issuer   string
	resource *url.URL
	opts     Options
	algs     []jose.SignatureAlgorithm
	keys     *keyCache
	intro    *introspector // nil without Options.Introspection
}

// New returns a ResourceServer for the resource (the MCP endpoint's
// absolute URL, as clients call it: a token must carry it in aud) whose
// tokens issuer issues. It checks the configuration only: the issuer is
// first reached when a token arrives, or by [ResourceServer.Check].
//
// The issuer must be an https URL, or http on a loopback address (a test
// or a sidecar on the same host).
func New(issuer, resource string, opts *Options) (*ResourceServer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := checkIssuer(issuer); err != nil {
		return nil, err
	}
	ru, err := url.Parse(resource)
	if err != nil || (ru.Scheme != "https" && ru.Scheme != "http") || ru.Host == "" || ru.Fragment != "" || ru.RawQuery != "" {
		return nil, fmt.Errorf("resource %q: want an absolute http(s) URL without query or fragment, such as https://mcp.example.com/mcp", resource)
	}
	if len(o.Algorithms) == 0 {
		o.Algorithms = defaultAlgorithms
	}
	for _, a := range o.Algorithms {
		if !slices.Contains(defaultAlgorithms, a) {
			return nil, fmt.Errorf("algorithm %q: want one of %v (none and HMAC are never accepted)", a, defaultAlgorithms)
		}
	}
	for tool, scopes := range o.ToolScopes {
		if tool == "" || len(scopes) == 0 {
			return nil, fmt.Errorf("tool scopes: want a tool name and at least one scope, got %q=%q", tool, scopes)
		}
	}
	for _, s := range slices.Concat(o.ScopesRequired, o.ScopesSupported) {
		if err := checkScope(s); err != nil {
			return nil, err
		}
	}
	for _, scopes := range o.ToolScopes {
		for _, s := range scopes {
			if err := checkScope(s); err != nil {
				return nil, err
			}
		}
	}
	switch {
	case o.Leeway == 0:
		o.Leeway = defaultLeeway
	case o.Leeway < 0:
		o.Leeway = 0
	}
	switch {
	case o.RefreshInterval == 0:
		o.RefreshInterval = defaultRefreshInterval
	case o.RefreshInterval < 0:
		o.RefreshInterval = 0
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: defaultHTTPTimeout, CheckRedirect: sameHostRedirect}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	rs := &ResourceServer{issuer: issuer, resource: ru, opts: o, algs: o.Algorithms}
	rs.keys = &keyCache{rs: rs}
	if o.Introspection != nil {
		cfg := *o.Introspection
		if cfg.ClientID == "" || cfg.ClientSecret == "" {
			return nil, errors.New("introspection: want the client id and secret this resource server authenticates with")
		}
		if cfg.Endpoint != "" {
			eu, err := url.Parse(cfg.Endpoint)
			if err != nil || !eu.IsAbs() {
				return nil, fmt.Errorf("introspection endpoint %q: want an absolute URL", cfg.Endpoint)
			}
			if err := checkFetchURL(eu, "introspection endpoint"); err != nil {
				return nil, err
			}
		}
		switch {
		case cfg.CacheTTL == 0:
			cfg.CacheTTL = defaultIntrospectionCacheTTL
		case cfg.CacheTTL < 0:
			cfg.CacheTTL = 0
		}
		rs.intro = &introspector{rs: rs, cfg: cfg, cache: map[[32]byte]introspected{}}
	}
	return rs, nil
}

// checkScope refuses what cannot be a scope-token (RFC 6749 §3.3), which
// would also break the challenge's scope parameter.
func checkScope(s string) error {
	if s == "" || strings.ContainsAny(s, " \"\\") || strings.ContainsFunc(s, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return fmt.Errorf("scope %q: want printable ASCII without spaces, quotes or backslashes", s)
	}
	return nil
}

// checkIssuer admits https, and http on a loopback host only: over plain
// http anyone on the path could hand us their own keys.
func checkIssuer(issuer string) error {
	u, err := url.Parse(issuer)
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("issuer %q: want an absolute https URL without query or fragment", issuer)
	}
	return checkFetchURL(u, "issuer")
}

func checkFetchURL(u *url.URL, what string) error {
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if loopback(u.Hostname()) {
			return nil
		}
	}
	return fmt.Errorf("%s %s: want https (http only on a loopback address)", what, u.Redacted())
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func sameHostRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 5 {
		return errors.New("too many redirects")
	}
	if req.URL.Host != via[0].URL.Host {
		return fmt.Errorf("redirect to another host (%s)", req.URL.Host)
	}
	return checkFetchURL(req.URL, "redirect")
}

// Issuer is the issuer tokens must come from.
func (rs *ResourceServer) Issuer() string { return rs.issuer }

// Resource is the resource tokens must be issued for.
func (rs *ResourceServer) Resource() string { return rs.resource.String() }
