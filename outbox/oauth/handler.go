package oauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/authhdr"
)

// wellKnownPath is RFC 9728's well-known path of Protected Resource
// Metadata.
const wellKnownPath = "/.well-known/oauth-protected-resource"

// MetadataPaths are the paths to serve [ResourceServer.MetadataHandler]
// at: RFC 9728 §3.1's path-suffixed form for the resource (for
// https://host/mcp, /.well-known/oauth-protected-resource/mcp), which is
// where MCP clients look first, and the bare well-known path, where the
// older ones look.
func (rs *ResourceServer) MetadataPaths() []string {
	p := strings.TrimSuffix(rs.resource.EscapedPath(), "/")
	if p == "" {
		return []string{wellKnownPath}
	}
	return []string{wellKnownPath + p, wellKnownPath}
}

// MetadataURL is the absolute URL of the metadata, as challenges name it.
func (rs *ResourceServer) MetadataURL() string {
	u := *rs.resource
	u.Path, u.RawPath = rs.MetadataPaths()[0], ""
	return u.String()
}

// Metadata is the resource's RFC 9728 metadata.
func (rs *ResourceServer) Metadata() *oauthex.ProtectedResourceMetadata {
	scopes := slices.Clone(rs.opts.ScopesSupported)
	if len(scopes) == 0 {
		scopes = slices.Clone(rs.opts.ScopesRequired)
		for _, s := range rs.opts.ToolScopes {
			scopes = append(scopes, s...)
		}
		slices.Sort(scopes)
		scopes = slices.Compact(scopes)
	}
	return &oauthex.ProtectedResourceMetadata{
		Resource:               rs.Resource(),
		AuthorizationServers:   []string{rs.issuer},
		ScopesSupported:        scopes,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           rs.opts.ResourceName,
	}
}

// MetadataHandler serves Metadata (the go-sdk's handler: GET, with CORS
// open to any origin, as the metadata is public).
func (rs *ResourceServer) MetadataHandler() http.Handler {
	return auth.ProtectedResourceMetadataHandler(rs.Metadata())
}

// Require puts h, the MCP endpoint, behind the resource server: every
// request needs a token Verify accepts, with Options.ScopesRequired; a
// tools/call of a tool in Options.ToolScopes needs that tool's scopes too.
// Refusals answer as package bearer's Require does, with the metadata's
// URL in every challenge, and so does the limit on refused tokens per
// client address (429 past it, but for a token accepted within the hour
// and not expired); its counts go to Options.Logger.
func (rs *ResourceServer) Require(h http.Handler) http.Handler {
	if len(rs.opts.ToolScopes) > 0 {
		h = rs.requireToolScopes(h)
	}
	// Refusals are logged at debug level, by reason only: why a client
	// gets 401 is what its operator asks first.
	verify := func(ctx context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
		ti, err := rs.Verify(ctx, token, r)
		if err != nil {
			rs.opts.Logger.DebugContext(ctx, "token refused", "reason", err.Error())
		}
		return ti, err
	}
	return bearer.Require(verify, &bearer.RequireOptions{
		ResourceMetadataURL: rs.MetadataURL(),
		Scopes:              rs.opts.ScopesRequired,
		Logger:              rs.opts.Logger,
	})(h)
}

// requireToolScopes refuses a POST whose tools/call names a tool the
// token lacks scopes for. It looks at the HTTP request rather than in the
// MCP server's middleware because the answer must be an HTTP 403 with a
// challenge (a JSON-RPC error would not start a client's step-up
// authorization), and because then the call is refused before the SDK
// decodes it: nothing of it runs, no claim is written.
func (rs *ResourceServer) requireToolScopes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		// The SDK's own bound: a larger body is refused by it anyway.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, mcp.DefaultMaxRequestBodyBytes))
		r.Body.Close()
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("request body larger than %d bytes", tooLarge.Limit), http.StatusRequestEntityTooLarge)
			return
		}
		if err != nil {
			http.Error(w, "read request body", http.StatusBadRequest)
			return
		}
		ti := auth.TokenInfoFromContext(r.Context())
		var have []string
		if ti != nil {
			have = ti.Scopes
		}
		var need []string
		names, unnamed := toolsCalled(body)
		if unnamed {
			for _, scopes := range rs.opts.ToolScopes {
				need = append(need, authhdr.Missing(have, scopes)...)
			}
		}
		for _, tool := range names {
			need = append(need, authhdr.Missing(have, rs.opts.ToolScopes[tool])...)
		}
		if len(need) > 0 {
			// The challenge names every scope the request needs, not only
			// the missing ones: a client asks for exactly these when it
			// steps up, and must not lose the ones it has.
			want := slices.Concat(rs.opts.ScopesRequired, need, have)
			slices.Sort(want)
			authhdr.WriteChallenge(w, http.StatusForbidden, authhdr.Challenge{
				ResourceMetadata: rs.MetadataURL(),
				Error:            "insufficient_scope",
				Description:      "insufficient scope for the tool",
				Scope:            slices.Compact(want),
			})
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// toolsCalled returns the names of the tools a POST body calls: one
// message or a batch. It must never see fewer calls or other names than
// the go-sdk does (FuzzToolsCalled holds it to that), so it reads as
// leniently: the SDK decodes with a decoder of its own that matches keys
// case-sensitively and ignores what follows the first JSON value; here a
// key counts in any spelling, only the first value is read, and a call
// without the exact key "name", or whatever cannot be read at all, is
// reported as unnamed, which then requires every tool's scopes.
func toolsCalled(body []byte) (names []string, unnamed bool) {
	var msgs []json.RawMessage
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		if decodeFirst(trimmed, &msgs) != nil {
			return nil, true
		}
	} else {
		msgs = []json.RawMessage{trimmed}
	}
	for _, raw := range msgs {
		var m map[string]json.RawMessage
		if decodeFirst(raw, &m) != nil {
			unnamed = true
			continue
		}
		call := false
		var params []json.RawMessage
		for k, v := range m {
			var s string
			switch {
			case strings.EqualFold(k, "method"):
				call = call || (decodeFirst(v, &s) == nil && s == "tools/call")
			case strings.EqualFold(k, "params"):
				params = append(params, v)
			}
		}
		if !call {
			continue
		}
		named := false
		for _, p := range params {
			var pm map[string]json.RawMessage
			if decodeFirst(p, &pm) != nil {
				continue
			}
			for k, v := range pm {
				var s string
				if strings.EqualFold(k, "name") && decodeFirst(v, &s) == nil {
					names = append(names, s)
					// Only the exact key names the call for the SDK:
					// params with "Name" alone reach it as a call of
					// tool "", which no scope covers.
					named = named || k == "name"
				}
			}
		}
		unnamed = unnamed || !named
	}
	return names, unnamed
}

// decodeFirst decodes the first JSON value of b into v, ignoring what
// follows, as the go-sdk's decoder does.
func decodeFirst(b []byte, v any) error {
	return json.NewDecoder(bytes.NewReader(b)).Decode(v)
}
