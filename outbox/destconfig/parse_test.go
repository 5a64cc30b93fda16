package destconfig

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

func TestParse(t *testing.T) {
	vars := map[string]string{
		"MCP_OUTBOX_DEST_MY_API":              "http://127.0.0.1:9/base",
		"MCP_OUTBOX_DEST_MY_API_AUTH":         "Bearer sk_test",
		"MCP_OUTBOX_DEST_MY_API_AT_MOST_ONCE": "true",
		"MCP_OUTBOX_DEST_MY_API_PROBE":        "GET /v1/idempotency/{key}",
		"MCP_OUTBOX_DEST_MY_API_TIMEOUT":      "3s",
		"MCP_OUTBOX_DEST_PAYMENTS":            "http://127.0.0.1:8;concurrency=2",
	}
	dests, err := Parse(environ(vars), []string{"payments=http://127.0.0.1:7;timeout=1s;max_attempts=3"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dests) != 2 {
		t.Fatalf("destinations = %+v", dests)
	}
	api, pay := dests[0], dests[1]
	if api.Name != "my_api" || api.URL.String() != "http://127.0.0.1:9/base" || !api.AtMostOnce ||
		api.AuthHeader != "Authorization" || api.AuthValue != "Bearer sk_test" || api.Timeout != 3*time.Second ||
		api.Probe == nil || api.Probe.Method != "GET" || api.Probe.Path != "/v1/idempotency/{key}" {
		t.Errorf("my_api = %+v", api)
	}
	// The flag's URL and settings win; the environment's other settings stay.
	if pay.Name != "payments" || pay.URL.Host != "127.0.0.1:7" || pay.Concurrency != 2 || pay.Timeout != time.Second ||
		pay.MaxAttempts != 3 || pay.AuthHeader != "" {
		t.Errorf("payments = %+v", pay)
	}
}

// environ is vars as os.Environ gives them, in no particular order.
func environ(vars map[string]string) []string {
	var out []string
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	return out
}

// A setting from the environment is trimmed as one from --dest is: a
// stray space does not become part of a probe's path (or refuse a
// timeout). The credential alone is kept as written.
func TestParseTrimsEnvironmentSettings(t *testing.T) {
	trimmed := map[string]string{
		"MCP_OUTBOX_DEST_A":              "https://a.test/base",
		"MCP_OUTBOX_DEST_A_AT_MOST_ONCE": "true",
		"MCP_OUTBOX_DEST_A_PROBE":        "GET /x/{key}",
		"MCP_OUTBOX_DEST_A_TIMEOUT":      "3s",
		"MCP_OUTBOX_DEST_A_MAX_AGE":      "1h",
		"MCP_OUTBOX_DEST_A_CONCURRENCY":  "2",
		"MCP_OUTBOX_DEST_A_MAX_ATTEMPTS": "5",
		"MCP_OUTBOX_DEST_A_AUTH_HEADER":  "X-Api-Key",
		"MCP_OUTBOX_DEST_A_AUTH":         "sk_test",
	}
	spaced := map[string]string{}
	for k, v := range trimmed {
		spaced[k] = " \t" + v + " \n"
	}
	spaced["MCP_OUTBOX_DEST_A_AUTH"] = " sk_test\t"
	want, err := Parse(environ(trimmed), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(environ(spaced), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Probe == nil || got[0].Probe.Path != "/x/{key}" || got[0].AuthValue != " sk_test\t" {
		t.Fatalf("spaced environment parses to %+v", got)
	}
	got[0].AuthValue = "sk_test"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("spaced environment parses to %+v, want %+v (probe %+v, want %+v)", got[0], want[0], *got[0].Probe, *want[0].Probe)
	}
	// A flag and a variable agree on the same spaced value.
	flag, err := Parse(environ(map[string]string{"MCP_OUTBOX_DEST_A_PROBE": "GET /x/{key} "}),
		[]string{"a=https://a.test/base;at_most_once;probe=GET /x/{key} "})
	if err != nil {
		t.Fatal(err)
	}
	if p := flag[0].Probe; p == nil || p.Path != "/x/{key}" {
		t.Errorf("probe = %+v, want path /x/{key}", p)
	}
}

// key_form chooses how Idempotency-Key carries the key, from a flag or a
// variable, in any case; left out, the dispatcher's default (quoted)
// applies. Another value is refused, naming the destination and the forms.
func TestParseKeyForm(t *testing.T) {
	dests, err := Parse(environ(map[string]string{
		"MCP_OUTBOX_DEST_STRIPE":          "https://api.stripe.test",
		"MCP_OUTBOX_DEST_STRIPE_KEY_FORM": "Bare",
		"MCP_OUTBOX_DEST_IETF":            "https://ietf.test",
	}), []string{"quoted=https://q.test;key-form=quoted", "plain=https://p.test"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]dispatch.KeyForm{}
	for _, d := range dests {
		got[d.Name] = d.KeyForm
	}
	want := map[string]dispatch.KeyForm{"stripe": dispatch.KeyBare, "quoted": dispatch.KeyQuoted, "ietf": "", "plain": ""}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("key forms = %v, want %v", got, want)
	}
	for _, c := range []struct{ env, flag []string }{
		{flag: []string{"stripe=https://api.stripe.test;key_form=unquoted"}},
		{env: []string{"MCP_OUTBOX_DEST_STRIPE=https://api.stripe.test", "MCP_OUTBOX_DEST_STRIPE_KEY_FORM=unquoted"}},
	} {
		_, err := Parse(c.env, c.flag)
		if err == nil || !strings.Contains(err.Error(), "stripe") || !strings.Contains(err.Error(), `key_form="unquoted"`) ||
			!strings.Contains(err.Error(), "quoted or bare") {
			t.Errorf("Parse(%q, %q) = %v, want a refusal naming the destination, the setting and the forms", c.env, c.flag, err)
		}
	}
}

// Help, which serve, proxy and drain print, names every setting but the
// credential, which it names as a variable.
func TestHelpNamesEverySetting(t *testing.T) {
	for _, s := range destSettings {
		if s == "auth" {
			s = "MCP_OUTBOX_DEST_<NAME>_AUTH"
		} else if s != "at_most_once" {
			s += "="
		}
		if !strings.Contains(Help, s) {
			t.Errorf("Help does not mention %s", s)
		}
	}
}
