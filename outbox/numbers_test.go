package outbox_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// TestNumbers_ChargeNotChanged: an amount a float64 cannot hold (the go-sdk
// decodes arguments into map[string]any) is refused, naming the argument and
// the value, and nothing is charged or recorded. Before, 9007199254740993 was
// charged as 9007199254740992, and a retry sending 9007199254740992 under the
// same key got key_conflict; the same key now names the first call that ran.
func TestNumbers_ChargeNotChanged(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	ctx := context.Background()

	res, err := callErr(ctx, b.session, "charge", "k1", json.RawMessage(`{"amount": 9007199254740993}`))
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || errorCode(res) != "invalid_arguments" {
		t.Fatalf("charge 9007199254740993: got %v %q (%s), want the invalid_arguments tool error", res.IsError, errorCode(res), text(res))
	}
	for _, want := range []string{`"/amount"`, "9007199254740993", "9007199254740992", "Nothing was executed"} {
		if !strings.Contains(text(res), want) {
			t.Errorf("error text %q does not mention %s", text(res), want)
		}
	}
	for _, table := range []string{"charges", "calls", "effects"} {
		if n := count(t, b.db.Read, `SELECT count(*) FROM `+table); n != 0 {
			t.Errorf("%s has %d rows after the refused call, want 0", table, n)
		}
	}

	// An amount the float64 does hold, under the same key, is a first call.
	res = call(t, b.session, "charge", "k1", json.RawMessage(`{"amount": 9007199254740991}`))
	if res.IsError {
		t.Fatalf("charge 9007199254740991 after the refusal: %s", text(res))
	}
	var amount int64
	if err := b.db.Read.QueryRow(`SELECT amount FROM charges`).Scan(&amount); err != nil || amount != 9007199254740991 {
		t.Fatalf("charged %d (%v), want 9007199254740991", amount, err)
	}
}

// TestNumbers_EveryTool: the check covers every tool registered through
// the layer, recorded or not, and numbers anywhere in the arguments; numbers
// that survive the float64 round trip pass untouched, strings are not
// numbers.
func TestNumbers_EveryTool(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l, err := outbox.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := l.NewServer(&mcp.Implementation{Name: "test", Version: "v0"}, nil)
	var ran atomic.Int64
	echo := func(ctx context.Context, tx outbox.Tx, req *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, map[string]any, error) {
		ran.Add(1)
		return nil, in, nil
	}
	outbox.AddTool(l, s, &mcp.Tool{Name: "recorded"}, echo, nil)
	outbox.AddTool(l, s, &mcp.Tool{Name: "unrecorded", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}, echo, nil)
	outbox.AddTool(l, s, &mcp.Tool{Name: "readonly", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, echo, nil)
	cs := connect(t, s)

	refused := []struct{ args, path, value string }{
		{`{"n":9007199254740993}`, `"/n"`, "9007199254740993"},
		{`{"n":-9007199254740993}`, `"/n"`, "-9007199254740993"},
		{`{"n":12345678901234567890}`, `"/n"`, "12345678901234567890"},
		{`{"n":1e400}`, `"/n"`, "1e400"},
		{`{"n":-1e400}`, `"/n"`, "-1e400"},
		{`{"n":1e-400}`, `"/n"`, "1e-400"},
		{`{"n":2e-324}`, `"/n"`, "2e-324"},
		{`{"n":0.10000000000000000001}`, `"/n"`, "0.10000000000000000001"},
		{`{"n":9007199254740993.0}`, `"/n"`, "9007199254740993.0"},
		{`{"items":[{"amount":1},{"amount":9007199254740993}]}`, `"/items/1/amount"`, "9007199254740993"},
		{`{"s":"a \"quoted\" 9007199254740993","m":{"a/b~c":[[1,2],[3,90071992547409930]]}}`, `"/m/a~1b~0c/1/1"`, "90071992547409930"},
		{`{"n":1` + strings.Repeat("0", 400) + `}`, `"/n"`, "(401 characters)"},
	}
	passed := []string{
		`{}`,
		`{"n":0.1}`, `{"n":1e20}`, `{"n":1e21}`, `{"n":1.0}`, `{"n":-0}`, `{"m":-0.0}`, `{"n":5e-324}`,
		`{"n":9007199254740991}`, `{"n":-9007199254740991}`, `{"n":9007199254740992}`, `{"n":0.30000000000000004}`,
		`{"n":1.7976931348623157e308}`, `{"n":123456789012345}`, `{"z":0e999999999999}`, `{"n":1E+2}`,
		`{"s":"9007199254740993","t":"\\","u":"\"1e400\""}`,
		`{"deep":[[[[{"n":[0.5,-2,3e-5]}]]]]}`,
	}
	for _, tool := range []string{"recorded", "unrecorded", "readonly"} {
		for _, c := range refused {
			before := ran.Load()
			res, err := callErr(context.Background(), cs, tool, "", json.RawMessage(c.args))
			if err != nil {
				t.Fatalf("%s %s: %v", tool, c.args, err)
			}
			if !res.IsError || errorCode(res) != "invalid_arguments" {
				t.Errorf("%s %.60s: got %v %q (%s), want invalid_arguments", tool, c.args, res.IsError, errorCode(res), text(res))
				continue
			}
			if !strings.Contains(text(res), "argument "+c.path+" is ") || !strings.Contains(text(res), c.value) {
				t.Errorf("%s %.60s: error %q does not name argument %s and %s", tool, c.args, text(res), c.path, c.value)
			}
			if ran.Load() != before {
				t.Errorf("%s %.60s: the handler ran", tool, c.args)
			}
		}
		for _, args := range passed {
			res, err := callErr(context.Background(), cs, tool, "", json.RawMessage(args))
			if err != nil || res.IsError {
				t.Errorf("%s %s: %v %s, want it to run", tool, args, err, text(res))
				continue
			}
			// What the handler got is the value sent.
			var sent, got any
			_ = json.Unmarshal([]byte(args), &sent)
			b, _ := json.Marshal(res.StructuredContent)
			_ = json.Unmarshal(b, &got)
			if sb, gb := mustJSON(t, sent), mustJSON(t, got); sb != gb {
				t.Errorf("%s %s: the handler got %s", tool, args, gb)
			}
		}
	}
	if n := count(t, db.Read, `SELECT count(*) FROM calls WHERE tool = 'recorded'`); n != len(passed) {
		t.Errorf("%d recorded calls, want %d (one per accepted argument set)", n, len(passed))
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Quote(string(b))
}
