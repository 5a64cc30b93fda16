package destconfig

import (
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// Help describes the syntax Parse reads, for a command's usage text.
const Help = `Destinations (where effects are delivered):
  --dest 'NAME=URL[;SETTING=VALUE...]' or MCP_OUTBOX_DEST_<NAME>=URL, with settings
  also as MCP_OUTBOX_DEST_<NAME>_<SETTING>=VALUE. Settings:
    timeout=10s        one attempt's limit
    concurrency=4      attempts in flight
    max_attempts=25    then the effect is dead
    max_age=72h        then the effect is dead
    at_most_once       the destination does not dedup on Idempotency-Key: after an
                       attempt whose outcome cannot be known the effect becomes
                       unknown and is never re-sent automatically
    probe='GET /path/{key}'  for at_most_once: asks whether an unknown effect arrived
                       (2xx: delivered; 404/410: send again)
    auth_header=Authorization  the header that carries MCP_OUTBOX_DEST_<NAME>_AUTH
    key_form=quoted    how Idempotency-Key carries the effect's key: quoted, as the
                       IETF draft's Structured Field string ("call_…-1"), or bare
                       (call_…-1), as Stripe takes it
  The credential is read only from MCP_OUTBOX_DEST_<NAME>_AUTH and never stored.`

// EnvPrefix starts the name of every environment variable Parse reads.
const EnvPrefix = "MCP_OUTBOX_DEST_"

// destSettings are the per-destination settings, longest first so that an
// environment name like MCP_OUTBOX_DEST_MY_API_AUTH_HEADER splits correctly.
var destSettings = []string{"auth_header", "max_attempts", "at_most_once", "concurrency", "key_form", "max_age", "timeout", "probe", "auth"}

// Parse merges the destinations of environ (NAME=value pairs, as
// os.Environ returns them; variables without [EnvPrefix] are ignored) and
// of flags (--dest values, NAME=URL[;SETTING=VALUE...]); a flag's URL and
// settings win over the environment's. White space around a URL or a
// setting's value is ignored, in a flag and in a variable alike, except
// around the credential of MCP_OUTBOX_DEST_<NAME>_AUTH, which is taken as
// written. The destinations come sorted by name, which is lower case. A
// refusal names the flag, variable or destination it is about.
func Parse(environ, flags []string) ([]dispatch.Destination, error) {
	type raw struct {
		url      string
		settings map[string]string
	}
	byName := map[string]*raw{}
	get := func(name string) *raw {
		if byName[name] == nil {
			byName[name] = &raw{settings: map[string]string{}}
		}
		return byName[name]
	}
	for _, kv := range prefixed(environ, EnvPrefix) {
		k, v, _ := strings.Cut(kv, "=")
		name, setting := k, ""
		for _, s := range destSettings {
			if strings.HasSuffix(k, "_"+s) && len(k) > len(s)+1 {
				name, setting = k[:len(k)-len(s)-1], s
				break
			}
		}
		if setting != "" {
			// Trimmed like a --dest setting, so that a stray space (say
			// after a probe's path) does not become part of the value.
			// The credential alone is taken as written: the parser never
			// alters it, and one with a control character, such as the
			// newline a secret file may end with, is refused below rather
			// than repaired. (net/http drops the spaces and tabs around a
			// header's value when it writes the request.)
			if setting != "auth" {
				v = strings.TrimSpace(v)
			}
			get(name).settings[setting] = v
			continue
		}
		u, opts, err := splitDest(v)
		if err != nil {
			return nil, fmt.Errorf("MCP_OUTBOX_DEST_%s: %v", strings.ToUpper(name), err)
		}
		r := get(name)
		r.url = u
		for s, val := range opts {
			r.settings[s] = val
		}
	}
	for _, f := range flags {
		name, rest, ok := strings.Cut(f, "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if !ok || name == "" {
			return nil, fmt.Errorf("--dest %q: want NAME=URL", f)
		}
		u, opts, err := splitDest(rest)
		if err != nil {
			return nil, fmt.Errorf("--dest %s: %v", name, err)
		}
		if _, ok := opts["auth"]; ok {
			return nil, fmt.Errorf("--dest %s: give the credential in MCP_OUTBOX_DEST_%s_AUTH, not on the command line", name, strings.ToUpper(name))
		}
		r := get(name)
		r.url = u
		for s, val := range opts {
			r.settings[s] = val
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []dispatch.Destination
	for _, name := range names {
		r := byName[name]
		if r.url == "" {
			return nil, fmt.Errorf("destination %s has settings but no URL (MCP_OUTBOX_DEST_%s=URL or --dest %s=URL)", name, strings.ToUpper(name), name)
		}
		d, err := buildDest(name, r.url, r.settings)
		if err != nil {
			return nil, fmt.Errorf("destination %s: %v", name, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// prefixed returns the NAME=value pairs of environ whose name starts with
// prefix, with the prefix removed and the name lower-cased, in a stable
// order.
func prefixed(environ []string, prefix string) []string {
	var out []string
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, prefix) && len(k) > len(prefix) {
			out = append(out, strings.ToLower(k[len(prefix):])+"="+v)
		}
	}
	sort.Strings(out)
	return out
}

// splitDest splits "URL;setting=value;flag" into the URL and its settings.
func splitDest(v string) (string, map[string]string, error) {
	parts := strings.Split(v, ";")
	opts := map[string]string{}
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		k, val, ok := strings.Cut(p, "=")
		k = strings.ToLower(strings.ReplaceAll(strings.TrimSpace(k), "-", "_"))
		if !ok {
			val = "true"
		}
		opts[k] = strings.TrimSpace(val)
	}
	return strings.TrimSpace(parts[0]), opts, nil
}

func buildDest(name, rawURL string, s map[string]string) (dispatch.Destination, error) {
	u, err := url.Parse(rawURL)
	// A host, not only a port ("http://:8080"), and a port a connection
	// can use: net/http refuses the one, dialing fails on the other, at
	// every delivery.
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || !validPort(u.Port()) {
		return dispatch.Destination{}, fmt.Errorf("%q is not an http(s) URL", rawURL)
	}
	d := dispatch.Destination{Name: name, URL: u, AuthHeader: "Authorization"}
	for k, v := range s {
		var err error
		switch k {
		case "timeout":
			d.Timeout, err = positiveDuration(v)
		case "max_age":
			d.MaxAge, err = positiveDuration(v)
		case "concurrency":
			d.Concurrency, err = positiveInt(v)
		case "max_attempts":
			d.MaxAttempts, err = positiveInt(v)
		case "at_most_once":
			d.AtMostOnce, err = strconv.ParseBool(v)
		case "auth_header":
			d.AuthHeader = v
			if !isHTTPToken(v) {
				err = fmt.Errorf("want an HTTP header name")
			}
		case "auth":
			d.AuthValue = v
			if strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
				// Never quoted: the value is a credential.
				return dispatch.Destination{}, fmt.Errorf("auth: the credential contains a control character, which an HTTP header cannot carry")
			}
		case "key_form":
			d.KeyForm = dispatch.KeyForm(strings.ToLower(v))
			if d.KeyForm != dispatch.KeyQuoted && d.KeyForm != dispatch.KeyBare {
				err = fmt.Errorf("want %s or %s", dispatch.KeyQuoted, dispatch.KeyBare)
			}
		case "probe":
			method, path, found := strings.Cut(v, " ")
			if !found {
				method, path = "GET", v
			}
			err = checkProbe(method, path)
			d.Probe = &dispatch.Probe{Method: strings.ToUpper(method), Path: path}
		default:
			err = fmt.Errorf("unknown setting (known: %s)", strings.Join(destSettings, ", "))
		}
		if err != nil {
			return dispatch.Destination{}, fmt.Errorf("%s=%q: %v", k, v, err)
		}
	}
	if d.AuthValue == "" {
		d.AuthHeader = ""
	}
	if d.Probe != nil && !d.AtMostOnce {
		return dispatch.Destination{}, fmt.Errorf("probe is only for at_most_once destinations")
	}
	return d, nil
}

// checkProbe refuses a probe that would fail at every attempt (net/http
// refuses the method) or ask something else than was written (the
// dispatcher appends only the path and query to the destination's URL).
func checkProbe(method, path string) error {
	if !isHTTPToken(method) {
		return fmt.Errorf("method %q: want 'METHOD /path/{key}'", method)
	}
	ref, err := url.Parse(strings.ReplaceAll(path, "{key}", "k"))
	if err != nil || !strings.HasPrefix(path, "/") || ref.Host != "" || ref.Fragment != "" {
		return fmt.Errorf("want 'METHOD /path/{key}', a path (and query) on the destination's URL")
	}
	return nil
}

// isHTTPToken reports whether s is an HTTP token (RFC 9110), as a header
// name or a method must be: net/http refuses a request with anything else.
func isHTTPToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

// validPort reports whether p, a URL's port, is absent or 1 to 65535.
func validPort(p string) bool {
	if p == "" {
		return true
	}
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

func positiveDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err == nil && d <= 0 {
		err = fmt.Errorf("must be positive")
	}
	return d, err
}

func positiveInt(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err == nil && n <= 0 {
		err = fmt.Errorf("must be positive")
	}
	return n, err
}
