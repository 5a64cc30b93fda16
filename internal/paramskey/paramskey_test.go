package paramskey

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestLift(t *testing.T) {
	t.Parallel()
	const into = "lifted"
	for _, tc := range []struct {
		name, in string
		want     string // "" when params come back unchanged
	}{
		{"Key", `{"name":"x","idempotencyKey":"k"}`, `{"_meta":{"lifted":"k"},"idempotencyKey":"k","name":"x"}`},
		{"KeepsMeta", `{"_meta":{"a":1},"idempotencyKey":"k"}`, `{"_meta":{"a":1,"lifted":"k"},"idempotencyKey":"k"}`},
		{"MetaNull", `{"_meta":null,"idempotencyKey":"k"}`, `{"_meta":{"lifted":"k"},"idempotencyKey":"k"}`},
		{"NotAString", `{"idempotencyKey":7}`, `{"_meta":{"lifted":7},"idempotencyKey":7}`},
		{"NoKey", `{"name":"x"}`, ``},
		{"MetaNotAnObject", `{"_meta":[1],"idempotencyKey":"k"}`, ``},
		{"ParamsNull", `null`, ``},
		{"ParamsNotAnObject", `[1]`, ``},
		{"Garbage", `{"idempotencyKey":`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in)
			got, changed := Lift(in, into)
			if string(in) != tc.in {
				t.Fatalf("Lift wrote into its input: %s", in)
			}
			if want := tc.want != ""; changed != want {
				t.Fatalf("Lift(%s) changed = %v, want %v (%s)", tc.in, changed, want, got)
			}
			if !changed {
				if !bytes.Equal(got, in) {
					t.Fatalf("Lift(%s) = %s unchanged, want its input", tc.in, got)
				}
				return
			}
			if string(got) != tc.want || !json.Valid(got) {
				t.Errorf("Lift(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestLiftCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     string // "" when params come back unchanged
	}{
		{"Task", `{"name":"x","task":{"ttl":60000}}`, `{"_meta":{"io.github.mcp-outbox/paramsTask":{"ttl":60000}},"name":"x","task":{"ttl":60000}}`},
		{"EmptyTask", `{"task":{}}`, `{"_meta":{"io.github.mcp-outbox/paramsTask":{}},"task":{}}`},
		{"TaskAndKey", `{"idempotencyKey":"k","task":{}}`, `{"_meta":{"io.github.mcp-outbox/paramsIdempotencyKey":"k","io.github.mcp-outbox/paramsTask":{}},"idempotencyKey":"k","task":{}}`},
		{"NullTask", `{"task":null}`, ``},
		{"Neither", `{"name":"x"}`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := LiftCall(json.RawMessage(tc.in))
			wantLifted(t, "LiftCall", tc.in, got, changed, tc.want)
		})
	}
}

func TestSetMeta(t *testing.T) {
	t.Parallel()
	set := map[string]json.RawMessage{"k": json.RawMessage(`1.50`), "gone": nil}
	for _, tc := range []struct {
		name, in string
		want     string // "" when SetMeta fails
	}{
		{"NoMeta", `{"a":1}`, `{"_meta":{"k":1.50},"a":1}`},
		{"KeepsMeta", `{"_meta":{"j":2.0,"k":0}}`, `{"_meta":{"j":2.0,"k":1.50}}`},
		{"Deletes", `{"_meta":{"gone":1,"j":2}}`, `{"_meta":{"j":2,"k":1.50}}`},
		{"MetaNull", `{"_meta":null}`, `{"_meta":{"k":1.50}}`},
		{"MetaNotAnObject", `{"_meta":[1]}`, ``},
		{"MetaString", `{"_meta":"x"}`, ``},
		{"ParamsNull", `null`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tc.in), &p); err != nil {
				t.Fatal(err)
			}
			got, err := SetMeta(p, set)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("SetMeta(%s) = %s, want an error", tc.in, got)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("SetMeta(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestMarkFront(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     string // "" when params come back unchanged
	}{
		{"NoParams", ``, `{"_meta":{"io.github.mcp-outbox/front":true}}`},
		{"ParamsNull", `null`, `{"_meta":{"io.github.mcp-outbox/front":true}}`},
		{"Overwrites", `{"_meta":{"io.github.mcp-outbox/front":false,"a":1},"v":"x"}`, `{"_meta":{"a":1,"io.github.mcp-outbox/front":true},"v":"x"}`},
		{"MetaNotAnObject", `{"_meta":[1]}`, ``},
		{"ParamsNotAnObject", `[1]`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := MarkFront(json.RawMessage(tc.in))
			wantLifted(t, "MarkFront", tc.in, got, changed, tc.want)
		})
	}
}

func TestLiftListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, id, in string
		want         string // "" when params come back unchanged
	}{
		{"TaskIDs", `7`, `{"notifications":{"taskIds":["a"]}}`, `{"_meta":{"io.github.mcp-outbox/listenTasks":{"id":7,"taskIds":["a"]}},"notifications":{"taskIds":["a"]}}`},
		{"NoTaskIDs", `7`, `{"notifications":{}}`, ``},
		{"NoID", ``, `{"notifications":{"taskIds":["a"]}}`, ``},
		{"MetaNotAnObject", `7`, `{"_meta":1,"notifications":{"taskIds":["a"]}}`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := LiftListen(json.RawMessage(tc.id), json.RawMessage(tc.in))
			wantLifted(t, "LiftListen", tc.in, got, changed, tc.want)
		})
	}
}

// wantLifted checks what a lift returned for in: want, or in unchanged
// when want is "".
func wantLifted(t *testing.T, fn, in string, got json.RawMessage, changed bool, want string) {
	t.Helper()
	if want == "" {
		if changed || string(got) != in {
			t.Fatalf("%s(%s) = %s, %v; want it unchanged", fn, in, got, changed)
		}
		return
	}
	if !changed || string(got) != want {
		t.Fatalf("%s(%s) = %s, %v; want %s", fn, in, got, changed, want)
	}
}
