package dispatch_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/internal/downstream"
	"github.com/mcp-outbox/mcp-outbox/outbox"
	"github.com/mcp-outbox/mcp-outbox/outbox/dispatch"
)

// sendIn is an effect as a test's "send" tool enqueues it to payments.
type sendIn struct {
	Path   string            `json:"path"`
	Header map[string]string `json:"header,omitempty"`
	Body   string            `json:"body,omitempty"`
}

// sendOut is what Enqueue returned for it.
type sendOut struct {
	Key string `json:"key"`
}

// addSend registers "send", a tool that enqueues the effect it is given
// and answers with the key Enqueue returned: what a downstream is told to
// compare with.
func (s *dispatchSetup) addSend() {
	outbox.AddTool(s.layer, s.server, &mcp.Tool{Name: "send"},
		func(ctx context.Context, tx outbox.Tx, _ *mcp.CallToolRequest, in sendIn) (*mcp.CallToolResult, sendOut, error) {
			key, err := tx.Enqueue(ctx, outbox.Effect{Destination: "payments", Path: in.Path, Header: in.Header, Body: []byte(in.Body)})
			return nil, sendOut{Key: key}, err
		}, nil)
}

// send calls "send" and returns the effect's key.
func (s *dispatchSetup) send(t *testing.T, in sendIn) string {
	t.Helper()
	res := call(t, s.session, "send", "send "+in.Path, in)
	if res.IsError {
		t.Fatalf("send %s: %s", in.Path, text(res))
	}
	out, _ := res.StructuredContent.(map[string]any)
	key, _ := out["key"].(string)
	if key == "" {
		t.Fatalf("send %s answered %v, want the effect's key", in.Path, res.StructuredContent)
	}
	return key
}

func drain(t *testing.T, d *dispatch.Dispatcher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := d.Drain(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Open() != 0 || c.Dead != 0 {
		t.Fatalf("counts after drain = %+v", c)
	}
}

// A JSON body goes out as application/json unless the effect names its
// own type, in any case of the header's name; any other body goes out as
// the effect wrote it, without a type guessed for it.
func TestDispatch_ContentType(t *testing.T) {
	t.Parallel()
	s := newDispatchSetup(t, 0, nil)
	s.addSend()
	cases := []struct {
		in   sendIn
		want []string // the Content-Type lines the destination got
	}{
		{sendIn{Path: "/json-object", Body: `{"amount":100}`}, []string{"application/json"}},
		{sendIn{Path: "/json-array", Body: " [1, 2]\n"}, []string{"application/json"}},
		{sendIn{Path: "/json-own-type", Body: `{"op":"add"}`,
			Header: map[string]string{"Content-Type": "application/merge-patch+json"}}, []string{"application/merge-patch+json"}},
		{sendIn{Path: "/json-own-type-lower", Body: `{"amount":1}`,
			Header: map[string]string{"content-type": "text/plain; charset=utf-8"}}, []string{"text/plain; charset=utf-8"}},
		{sendIn{Path: "/form", Body: "amount=100&currency=usd"}, nil},
		{sendIn{Path: "/form-own-type", Body: "amount=100",
			Header: map[string]string{"CONTENT-TYPE": "application/x-www-form-urlencoded"}}, []string{"application/x-www-form-urlencoded"}},
		{sendIn{Path: "/truncated-json", Body: `{"amount":`}, nil},
		{sendIn{Path: "/empty"}, nil},
	}
	for _, c := range cases {
		s.send(t, c.in)
	}
	drain(t, s.dispatcher(t, dispatch.Destination{}, nil))
	got := map[string][]string{}
	for _, r := range s.fake.Requests() {
		got[r.Path] = r.Header.Values("Content-Type")
	}
	for _, c := range cases {
		v, sent := got[c.in.Path]
		if !sent {
			t.Errorf("%s: not delivered", c.in.Path)
		} else if fmt.Sprint(v) != fmt.Sprint(c.want) {
			t.Errorf("%s: Content-Type %q, want %q", c.in.Path, v, c.want)
		}
	}
}

// The destination gets, in Idempotency-Key, the key Enqueue returned: as
// it is where the destination's KeyForm is bare (Stripe's form), as a
// Structured Field String that unquotes to it by default and where it is
// quoted (draft-ietf-httpapi-idempotency-key-header). Probes of an
// at_most_once destination send it in the same form.
func TestDispatch_KeyForm(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		form   dispatch.KeyForm
		quoted bool
	}{{"", true}, {dispatch.KeyQuoted, true}, {dispatch.KeyBare, false}} {
		t.Run(fmt.Sprintf("Form=%q", c.form), func(t *testing.T) {
			t.Parallel()
			// NoDedup, so the lost response below leaves the effect
			// unknown and the probe asks about it.
			s := newDispatchSetup(t, 0, &downstream.Options{NoDedup: true})
			s.addSend()
			keys := []string{s.send(t, sendIn{Path: "/v1/charges", Body: `{"n":1}`}), s.send(t, sendIn{Path: "/v1/lost", Body: `{"n":2}`})}
			s.fake.FailNext(1, downstream.AcceptThenClose().ForPath("/v1/lost"))
			d := s.dispatcher(t, dispatch.Destination{KeyForm: c.form, AtMostOnce: true,
				Probe: &dispatch.Probe{Path: "/v1/idempotency/{key}"}, Timeout: time.Second}, nil)
			round(t, d)
			s.clk.Add(10 * time.Second) // past the probe delay
			round(t, d)
			reqs := s.fake.Requests()
			if len(reqs) != 3 || reqs[2].Outcome != downstream.Probed {
				t.Fatalf("requests %+v, want the two effects and a probe", reqs)
			}
			for _, r := range reqs {
				want := keys[0]
				if r.Path != "/v1/charges" {
					want = keys[1]
				}
				raw := r.Header.Get("Idempotency-Key")
				if c.quoted {
					// r.Key is the fake's Structured Field parse of raw.
					if !strings.HasPrefix(raw, `"`) || r.Key != want {
						t.Errorf("%s %s: Idempotency-Key %s unquotes to %q, want the sf-string of %q", r.Method, r.Path, raw, r.Key, want)
					}
				} else if raw != want {
					t.Errorf("%s %s: Idempotency-Key %s, want %s as Enqueue returned it", r.Method, r.Path, raw, want)
				}
			}
		})
	}
}

func TestDispatch_KeyFormUnknownIsRefused(t *testing.T) {
	t.Parallel()
	_, err := dispatch.New(openDB(t), &dispatch.Options{Destinations: []dispatch.Destination{
		{Name: "payments", URL: &url.URL{Scheme: "http", Host: "127.0.0.1:9"}, KeyForm: "Bare"},
	}})
	if err == nil || !strings.Contains(err.Error(), `"payments"`) || !strings.Contains(err.Error(), `"Bare"`) ||
		!strings.Contains(err.Error(), `"bare"`) {
		t.Fatalf("New with key form Bare: %v, want a refusal naming the destination, the value and the forms", err)
	}
}
