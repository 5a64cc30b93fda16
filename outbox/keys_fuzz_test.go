package outbox

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/paramskey"
)

// FuzzIdentify checks key extraction from every source at once: _meta
// (as the SDK decodes it), params.idempotencyKey (as the lift leaves it in
// _meta), the Idempotency-Key header (0, 1 or 2 of them), the
// idempotency_key argument, and the fingerprint. The first source present
// wins; a key is accepted only if valid (at most 255 bytes, printable);
// a fingerprint is the one of principal, tool and canonical arguments; and
// a refusal wraps callkey.ErrInvalidKey or names the arguments.
func FuzzIdentify(f *testing.F) {
	type seed struct {
		meta, args, header1, header2, user string
		headers                            uint8
		keyArg, window                     bool
	}
	for _, s := range []seed{
		{meta: `{"idempotencyKey":"order-1"}`, args: `{"amount":100}`, window: true},
		{meta: `{"io.github.mcp-outbox/paramsIdempotencyKey":"p-1"}`, args: `{"amount":100}`},
		{meta: `{"idempotencyKey":"m","io.github.mcp-outbox/paramsIdempotencyKey":"p"}`, args: `{}`, header1: "h", headers: 1},
		{meta: `{"idempotencyKey":null}`, args: `{"idempotency_key":"a-1","amount":1}`, keyArg: true},
		{meta: `{"idempotencyKey":7}`, args: `{}`},
		{meta: `{"idempotencyKey":""}`, args: `{}`},
		{meta: `{"idempotencyKey":"` + strings.Repeat("k", 256) + `"}`, args: `{}`},
		{meta: `{"idempotencyKey":"a\nb"}`, args: `{}`},
		{meta: `{}`, args: `{"amount":1}`, header1: `"quoted \"key\""`, headers: 1, user: "alice"},
		{meta: `{}`, args: `{"amount":1}`, header1: "a", header2: "b", headers: 2},
		{meta: `{}`, args: `{"amount":1}`, header1: `  bare  `, headers: 1},
		{meta: `{}`, args: `{"amount":1}`, header1: `""`, headers: 1},
		{meta: `{}`, args: `{"idempotency_key":5}`, keyArg: true},
		{meta: `{}`, args: `{"idempotency_key":null,"amount":2}`, keyArg: true, window: true},
		{meta: `{}`, args: `{"idempotency_key":"x"}`, keyArg: false, window: true},
		{meta: `null`, args: `null`, window: true},
		{meta: `{}`, args: `{"amount":18446744073709551617}`, window: true, user: "bob"},
		{meta: `{}`, args: "{\"s\":\"\xff\"}", window: true},
		{meta: `{}`, args: `{"a":`, window: true},
		{meta: `{}`, args: "\xef\xbb\xbf{}", window: true},
	} {
		f.Add(s.meta, s.args, s.header1, s.header2, s.headers, s.keyArg, s.window, s.user)
	}
	f.Fuzz(func(t *testing.T, metaJSON, args, header1, header2 string, headers uint8, keyArg, window bool, user string) {
		var meta mcp.Meta
		if json.Unmarshal([]byte(metaJSON), &meta) != nil {
			return // the SDK refuses such params before the layer
		}
		req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: "charge", Meta: meta, Arguments: json.RawMessage(args)}}
		var hdr http.Header
		if headers%3 > 0 || user != "" {
			hdr = http.Header{}
			if headers%3 > 0 {
				hdr.Add(HeaderIdempotencyKey, header1)
			}
			if headers%3 > 1 {
				hdr.Add(HeaderIdempotencyKey, header2)
			}
			req.Extra = &mcp.RequestExtra{Header: hdr}
			if user != "" {
				req.Extra.TokenInfo = &auth.TokenInfo{UserID: user}
			}
		}
		tool := &toolInfo{name: "charge", keyArgument: keyArg}
		id, err := identify(req, tool, window, nil)

		principal := callkey.LocalPrincipal
		if user != "" {
			principal = callkey.UserPrincipal(user)
		}
		canonical, cerr := callkey.Canonical(json.RawMessage(args))
		if cerr != nil {
			if err == nil || !strings.Contains(err.Error(), "arguments") {
				t.Fatalf("arguments %q do not canonicalize (%v), identify said %v", args, cerr, err)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, callkey.ErrInvalidKey) {
				t.Fatalf("identify: %v, not an invalid key", err)
			}
			return
		}
		if id.principal != principal || id.argsHash != callkey.ArgsHash(canonical) {
			t.Fatalf("principal %q, args hash %s; want %q, %s", id.principal, id.argsHash, principal, callkey.ArgsHash(canonical))
		}
		// The first source present decides.
		var want string
		var source callkey.Source
		switch {
		case meta[MetaKeyIdempotency] != nil:
			want, source = meta[MetaKeyIdempotency].(string), callkey.SourceMeta
		case meta[paramskey.MetaKey] != nil:
			want, source = meta[paramskey.MetaKey].(string), callkey.SourceParams
		case headers%3 == 1:
			want, source = unquoteHeader(header1), callkey.SourceHeader
		case keyArg && argumentKey(args) != nil:
			want, source = *argumentKey(args), callkey.SourceArgument
		case window:
			want, source = callkey.Fingerprint(principal, "charge", canonical), callkey.SourceFingerprint
		}
		if id.key != want || id.source != source {
			t.Fatalf("key %q from %q, want %q from %q", id.key, id.source, want, source)
		}
		if source == "" {
			return
		}
		if len(id.key) > callkey.MaxKeyBytes || callkey.Validate(id.key) != nil {
			t.Fatalf("accepted key %q: over %d bytes or not printable", id.key, callkey.MaxKeyBytes)
		}
		if source == callkey.SourceHeader {
			// Whatever key was accepted bare, its quoted form names the same key.
			if got := unquoteHeader(quoteHeader(id.key)); got != id.key {
				t.Fatalf("header %q: key %q, quoted %q gives %q", header1, id.key, quoteHeader(id.key), got)
			}
		}
	})
}

// argumentKey is the idempotency_key argument when it is a string.
func argumentKey(args string) *string {
	var a map[string]json.RawMessage
	if json.Unmarshal([]byte(args), &a) != nil {
		return nil
	}
	raw := a[ArgumentIdempotencyKey]
	var s string
	if string(raw) == "null" || json.Unmarshal(raw, &s) != nil {
		return nil // absent, null (no key) or not a string (refused)
	}
	return &s
}

// quoteHeader is the Structured Field string a client following the
// draft would send for key.
func quoteHeader(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}
