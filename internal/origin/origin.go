// Package origin checks the Origin of requests to an MCP endpoint, as the
// Streamable HTTP transport wants: a server MUST validate Origin on every
// incoming connection and answer 403 to one it does not accept, so that a
// web page of another origin, in the browser of someone who can reach the
// server (a DNS-rebound page against a local server, say), cannot use it.
package origin

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Check returns h behind the rule on the Origin header:
//   - absent: allowed (MCP clients that are not browsers send none);
//   - the server's own origin, scheme://Host of the request, the scheme
//     https when the connection is TLS or X-Forwarded-Proto says so (a
//     proxy that terminates TLS), as the operator page's Secure cookie
//     judges it: allowed;
//   - one of allowed (scheme://host[:port], compared without case or a
//     trailing slash): allowed;
//   - anything else, "null" (a sandboxed or file: page) included: 403.
//
// Every method is checked. The go-sdk's StreamableHTTPOptions
// .CrossOriginProtection (net/http's CrossOriginProtection) is not used:
// it lets GET, HEAD and OPTIONS through unchecked, and a GET opens the
// session's event stream, which a foreign page must not read either; and
// it trusts Sec-Fetch-Site, a header only browsers send, where this rule
// needs only Origin.
func Check(allowed []string, h http.Handler) http.Handler {
	var ok []string
	for _, a := range allowed {
		ok = append(ok, normalize(a))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := r.Header.Get("Origin")
		if o == "" || normalize(o) == own(r) || slices.Contains(ok, normalize(o)) {
			h.ServeHTTP(w, r)
			return
		}
		http.Error(w, fmt.Sprintf("origin %q is not allowed: a web page of another origin may not use this MCP server; "+
			"allow it with --allowed-origin (mcphttp.Options.AllowedOrigins)", o), http.StatusForbidden)
	})
}

// own is the origin a page served by this server would send, normalized.
func own(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(strings.TrimSpace(strings.Split(r.Header.Get("X-Forwarded-Proto"), ",")[0]), "https") {
		scheme = "https"
	}
	return normalize(scheme + "://" + r.Host)
}

// normalize lower-cases an origin and drops a trailing slash and the
// scheme's default port, which browsers leave out; what does not parse as
// scheme://host is returned lower-cased, to match nothing but itself.
func normalize(o string) string {
	o = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(o), "/"))
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return o
	}
	host := u.Host
	if p := u.Port(); (u.Scheme == "http" && p == "80") || (u.Scheme == "https" && p == "443") {
		host = strings.TrimSuffix(host, ":"+p)
	}
	return u.Scheme + "://" + host
}

// Valid returns an error unless o is an origin a browser sends:
// http or https, a host, an optional port, nothing after (a trailing
// slash aside). Anything else would match no request's Origin.
func Valid(o string) error {
	u, err := url.Parse(strings.TrimSuffix(strings.TrimSpace(o), "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" ||
		u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("origin %q: want scheme://host[:port], such as https://app.example.com", o)
	}
	return nil
}

// WarnInvalid logs a warning for each entry of allowed that is not Valid:
// a library handler takes its origins without returning an error, and a
// typo must not look like a browser's failure only.
func WarnInvalid(logger *slog.Logger, allowed []string, field string) {
	for _, o := range allowed {
		if err := Valid(o); err != nil {
			logger.Warn(field+" has an entry that matches no request: "+err.Error(), "entry", o)
		}
	}
}
