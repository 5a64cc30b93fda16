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
			if tc.want == "" {
				if changed || string(got) != tc.in {
					t.Fatalf("LiftCall(%s) = %s, %v; want it unchanged", tc.in, got, changed)
				}
				return
			}
			if !changed || string(got) != tc.want {
				t.Fatalf("LiftCall(%s) = %s, %v; want %s", tc.in, got, changed, tc.want)
			}
		})
	}
}
