package destconfig

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// FuzzParse checks --dest and MCP_OUTBOX_DEST_* parsing: a
// destination that parses is usable (an http(s) URL with a host, a header
// name and value and a probe that net/http accepts, so no delivery fails
// for a setting that looked fine at start-up), and written back as a
// --dest flag it parses to the same destination. A refusal names the
// destination or the flag it is about.
func FuzzParse(f *testing.F) {
	for _, s := range [][3]string{
		{"payments=https://api.example.test", "", ""},
		{"payments=http://127.0.0.1:8080/base;timeout=3s;concurrency=2;max_attempts=5;max_age=1h", "", ""},
		{"legacy=https://legacy.test;at_most_once;probe=GET /v1/charges/{key}", "LEGACY_AUTH", "Bearer sk_test"},
		{"legacy=https://legacy.test;at-most-once=true;probe=head /v1/{key}?x=1", "LEGACY_AUTH_HEADER", "X-Api-Key"},
		{"a=https://a.test;auth_header=Bad Header", "A_AUTH", "v"},
		{"a=https://a.test", "A_AUTH", "line\r\nInjected: 1"},
		{"a=https://a.test;at_most_once;probe=G(T /x", "", ""},
		{"a=https://a.test;at_most_once;probe=GET /a b#frag", "", ""},
		{"a=https://a.test;probe=GET /x", "", ""},
		{"a=https://a.test;timeout=-1s", "", ""},
		{"a=https://a.test;concurrency=0", "", ""},
		{"a=https://a.test;bogus=1", "", ""},
		{"stripe=https://api.stripe.test;key_form=bare", "", ""},
		{"a=https://a.test;key_form=sf", "", ""},
		{"", "STRIPE_KEY_FORM", "BARE"},
		{"a=https://a.test;auth=secret", "", ""},
		{"a=ftp://a.test", "", ""},
		{"a=", "", ""},
		{"=https://a.test", "", ""},
		{"noequals", "", ""},
		{" A =\thttps://a.test/p%20q ; timeout = 1m ;; ", "", ""},
		{"a=https://[::1]:9/", "", ""},
		{"a=https://user:pw@a.test/", "", ""},
		{"\xff=https://a.test", "", ""},
		{"", "PAYMENTS", "http://127.0.0.1:9;concurrency=3"},
		{"", "PAYMENTS_TIMEOUT", "5s"},
		{"", "MY_API_AUTH_HEADER", "Authorization"},
		{"", "_AUTH", "x"},
		{"payments=http://127.0.0.1:7", "PAYMENTS", "http://127.0.0.1:9"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, flagValue, envName, envValue string) {
		vars := map[string]string{}
		if envName != "" && !strings.ContainsAny(envName, "=\x00") {
			vars["MCP_OUTBOX_DEST_"+envName] = envValue
		}
		var flags []string
		if flagValue != "" {
			flags = []string{flagValue}
		}
		dests, err := Parse(environ(vars), flags)
		if err != nil {
			checkNamesBadPart(t, err, flagValue, envName)
			return
		}
		for _, d := range dests {
			checkUsable(t, d)
			back := formatDest(d)
			u, opts, err := splitDest(back)
			if err != nil {
				t.Fatalf("%q written back as %q: %v", d.Name, back, err)
			}
			if d.AuthValue != "" {
				opts["auth"] = d.AuthValue
			}
			if d.Probe != nil && strings.Contains(d.Probe.Path, ";") {
				// Only a variable can give it (formatDest).
				opts["probe"] = d.Probe.Method + " " + d.Probe.Path
			}
			again, err := buildDest(d.Name, u, opts)
			if err != nil {
				t.Fatalf("%+v written back as %q: %v", d, back, err)
			}
			if !sameDest(d, again) {
				t.Fatalf("%+v written back as %q parses to %+v", d, back, again)
			}
		}
	})
}

// checkNamesBadPart wants an error to say which destination, variable or
// flag it is about.
func checkNamesBadPart(t *testing.T, err error, flagValue, envName string) {
	t.Helper()
	msg := err.Error()
	name, _, _ := strings.Cut(flagValue, "=")
	candidates := []string{fmt.Sprintf("%q", flagValue)}
	if n := strings.ToLower(strings.TrimSpace(name)); n != "" {
		candidates = append(candidates, n)
	}
	if envName != "" {
		candidates = append(candidates, strings.ToLower(envName), strings.ToUpper(envName))
		for _, s := range destSettings {
			if n, ok := strings.CutSuffix(strings.ToLower(envName), "_"+s); ok && n != "" {
				candidates = append(candidates, n)
			}
		}
	}
	for _, c := range candidates {
		if strings.Contains(msg, c) {
			return
		}
	}
	t.Fatalf("error %q names none of %q", msg, candidates)
}

// checkUsable builds the requests the dispatcher will make for d and has
// net/http check them, without sending anything.
func checkUsable(t *testing.T, d dispatch.Destination) {
	t.Helper()
	if d.Name == "" || d.URL == nil || (d.URL.Scheme != "http" && d.URL.Scheme != "https") || d.URL.Hostname() == "" {
		t.Fatalf("destination %+v: no name or not an http(s) URL with a host", d)
	}
	if p := d.URL.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			t.Fatalf("destination %+v: port %q, which no connection can use", d, p)
		}
	}
	if d.Timeout < 0 || d.MaxAge < 0 || d.Concurrency < 0 || d.MaxAttempts < 0 {
		t.Fatalf("destination %+v: a negative bound", d)
	}
	if d.Probe != nil && (!d.AtMostOnce || !strings.HasPrefix(d.Probe.Path, "/")) {
		t.Fatalf("destination %+v: probe without at_most_once, or not a path", d)
	}
	if d.KeyForm != "" && d.KeyForm != dispatch.KeyQuoted && d.KeyForm != dispatch.KeyBare {
		t.Fatalf("destination %+v: a key form the dispatcher refuses", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // net/http checks method and header before it would connect
	try := func(what, method, target string) {
		req, err := http.NewRequestWithContext(ctx, method, target, nil)
		if err != nil {
			t.Fatalf("destination %+v: %s: %v", d, what, err)
		}
		if d.AuthHeader != "" {
			req.Header.Set(d.AuthHeader, d.AuthValue)
		}
		if _, err := http.DefaultTransport.RoundTrip(req); err != context.Canceled {
			t.Fatalf("destination %+v: %s refused by net/http: %v", d, what, err)
		}
	}
	try("delivery", http.MethodPost, d.URL.JoinPath("/v1/charges").String())
	if d.Probe != nil {
		// As the dispatcher's probe builds it (outbox's probeURL).
		ref, err := url.Parse(strings.ReplaceAll(d.Probe.Path, "{key}", url.PathEscape("key/1")))
		if err != nil || ref.Host != "" || ref.Fragment != "" {
			t.Fatalf("destination %+v: probe path: %v, or more than a path and query", d, err)
		}
		u := *d.URL
		u.Path = strings.TrimSuffix(d.URL.Path, "/") + ref.Path
		u.RawPath, u.RawQuery = "", ref.RawQuery
		try("probe", d.Probe.Method, u.String())
	}
}

// formatDest writes d as a --dest flag value, without the credential,
// which only the environment may carry, and without a probe whose path has
// a ';', which would end the setting: only MCP_OUTBOX_DEST_<NAME>_PROBE
// can give that. In the URL a ';' (which String leaves raw where the user
// wrote %3B, in the user name, the path or the fragment) is written %3B,
// which decodes to the same URL.
func formatDest(d dispatch.Destination) string {
	var b strings.Builder
	b.WriteString(strings.ReplaceAll(d.URL.String(), ";", "%3B"))
	if d.Timeout != 0 {
		fmt.Fprintf(&b, ";timeout=%s", d.Timeout)
	}
	if d.MaxAge != 0 {
		fmt.Fprintf(&b, ";max_age=%s", d.MaxAge)
	}
	if d.Concurrency != 0 {
		fmt.Fprintf(&b, ";concurrency=%d", d.Concurrency)
	}
	if d.MaxAttempts != 0 {
		fmt.Fprintf(&b, ";max_attempts=%d", d.MaxAttempts)
	}
	if d.AtMostOnce {
		b.WriteString(";at_most_once")
	}
	if d.Probe != nil && !strings.Contains(d.Probe.Path, ";") {
		fmt.Fprintf(&b, ";probe=%s %s", d.Probe.Method, d.Probe.Path)
	}
	if d.AuthHeader != "" {
		fmt.Fprintf(&b, ";auth_header=%s", d.AuthHeader)
	}
	if d.KeyForm != "" {
		fmt.Fprintf(&b, ";key_form=%s", d.KeyForm)
	}
	return b.String()
}

// sameDest reports whether a and b are the same destination: the same
// settings, and URLs with the same parts once decoded (scheme, user and
// password, host, path, query, fragment) and the same escaped form, taking
// ';' and its escape %3B as the same (String writes a path's decoded ';'
// raw when it escapes the path anew, which it does when the written form
// had a byte to escape, as in "/a b%3B").
func sameDest(a, b dispatch.Destination) bool {
	ua, ub := a.URL, b.URL
	a.URL, b.URL = nil, nil
	semi := strings.NewReplacer(";", "%3B")
	return ua.Scheme == ub.Scheme && ua.Opaque == ub.Opaque && reflect.DeepEqual(ua.User, ub.User) &&
		ua.Host == ub.Host && ua.Path == ub.Path && ua.RawQuery == ub.RawQuery &&
		ua.ForceQuery == ub.ForceQuery && ua.Fragment == ub.Fragment &&
		semi.Replace(ua.String()) == semi.Replace(ub.String()) &&
		reflect.DeepEqual(a, b)
}
