package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// TestTracingSetup: tracing is on only when the environment asks for it,
// and a setting it cannot honour is an error, not a silent no-op.
func TestTracingSetup(t *testing.T) {
	// Not parallel: the SDK's error handler is process-wide.
	const endpoint = "http://127.0.0.1:1" // nothing listens; nothing is sent either
	for _, tc := range []struct {
		name    string
		vars    map[string]string
		on      bool
		wantErr string
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, true, ""},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint + "/v1/traces"}, true, ""},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, ""},
		{"otlp without endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, ""},
		{"exporter none wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_EXPORTER": "none"}, false, ""},
		{"sdk disabled wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SDK_DISABLED": "true"}, false, ""},
		{"unknown exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER=zipkin"},
		{"unknown protocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := testEnv(tc.vars, strings.NewReader(""), io.Discard, io.Discard)
			tp, stop, err := setupTracing(context.Background(), env, "test", io.Discard, slog.New(slog.DiscardHandler))
			defer stop()
			if tc.wantErr != "" {
				var usage usageError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &usage) {
					t.Fatalf("err = %v, want a usage error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tp != nil; got != tc.on {
				t.Errorf("tracing on = %v, want %v", got, tc.on)
			}
		})
	}
}

// TestTracingConsole: the console exporter writes spans to stderr (stdout
// is the stdio transport), and stop flushes what is buffered.
func TestTracingConsole(t *testing.T) {
	var stderr syncBuffer
	env := testEnv(map[string]string{"OTEL_TRACES_EXPORTER": "console"}, strings.NewReader(""), io.Discard, &stderr)
	tp, stop, err := setupTracing(context.Background(), env, "console-test", &stderr, slog.New(slog.DiscardHandler))
	if err != nil || tp == nil {
		t.Fatalf("setup: %v, provider %v", err, tp)
	}
	_, span := tp.Tracer("t").Start(context.Background(), "span-on-stderr")
	span.End()
	stop()
	if out := stderr.String(); !strings.Contains(out, "span-on-stderr") || !strings.Contains(out, "console-test") {
		t.Errorf("stderr after stop = %q, want the span and the service", out)
	}
}

// TestTracingHelp: serve's and proxy's help name the variables that
// configure tracing.
func TestTracingHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"serve", "proxy"} {
		r := runCLI(t, nil, cmd, "--help")
		for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL",
			"OTEL_TRACES_SAMPLER", "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED", "params._meta"} {
			if !strings.Contains(r.stdout, v) {
				t.Errorf("%s --help does not mention %s", cmd, v)
			}
		}
	}
}
