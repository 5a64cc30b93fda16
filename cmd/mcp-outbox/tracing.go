package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
)

// tracingHelp is the part of serve's and proxy's help about traces.
const tracingHelp = `Tracing (OpenTelemetry), configured by the standard environment variables
and off unless they ask for it. On, every MCP request gets a server span whose
parent is the trace context the client sent in params._meta (traceparent,
tracestate, baggage), each effect delivery attempt a client span in the trace
of the call that enqueued it (its traceparent goes to the destination), and
the proxy a client span per forwarded call (its context goes to the upstream
in _meta). Keys appear as hashes; arguments and results only with
--log-sensitive.
  OTEL_EXPORTER_OTLP_ENDPOINT            the collector, e.g. http://127.0.0.1:4318;
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT     setting either turns tracing on
  OTEL_TRACES_EXPORTER                   otlp (on, to localhost:4318 without an
                                         endpoint), console (spans as JSON on
                                         stderr), none (off; the default when no
                                         endpoint is set)
  OTEL_EXPORTER_OTLP_PROTOCOL            http/protobuf (default) or grpc (then the
                                         endpoint is usually http://HOST:4317)
  OTEL_TRACES_SAMPLER, _ARG              e.g. parentbased_traceidratio and 0.1;
                                         default parentbased_always_on
  OTEL_SERVICE_NAME                      default mcp-outbox (serve) or
                                         mcp-outbox-proxy (proxy)
  OTEL_SDK_DISABLED=true                 off, whatever else is set
OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _INSECURE and
OTEL_BSP_* work as the OpenTelemetry SDK documents them. Spans still buffered
are flushed on exit (up to 5s).

`

// tracingShutdownTimeout bounds the flush of buffered spans on exit.
const tracingShutdownTimeout = 5 * time.Second

// setupTracing builds the tracer provider the environment asks for, or
// returns nil (the layer then uses the global provider, a no-op: no SDK,
// no exporter, no goroutine) when it asks for none. stop flushes and shuts
// the provider down; it is never nil.
//
// Whether tracing is on is read through env (tests inject it); the SDK and
// the exporters read their own settings (endpoint, headers, sampler, batch
// delays) from the process environment, as every OpenTelemetry SDK does.
func setupTracing(ctx context.Context, env *environment, service string, stderr io.Writer, logger *slog.Logger) (trace.TracerProvider, func(), error) {
	noop := func() {}
	if strings.EqualFold(strings.TrimSpace(env.getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, noop, nil
	}
	exporterName := strings.ToLower(strings.TrimSpace(env.getenv("OTEL_TRACES_EXPORTER")))
	endpoint := env.getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || env.getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	switch {
	case exporterName == "none":
		return nil, noop, nil
	case exporterName == "" && !endpoint:
		// The SDK's own default exporter is otlp to localhost; nothing
		// configured here means nothing traced, at no cost.
		return nil, noop, nil
	}
	exp, err := newSpanExporter(ctx, env, exporterName, stderr)
	if err != nil {
		return nil, noop, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service), semconv.ServiceVersion(serverVersion())),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		// A partial resource (say, a malformed OTEL_RESOURCE_ATTRIBUTES)
		// still names the service: say so and go on.
		logger.Warn("tracing: resource", "error", err)
	}
	// Export failures (a collector that is down) reach the log, not the
	// SDK's default logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing", "error", err)
	}))
	// Handed to the layer and the dispatcher explicitly, not installed as
	// the global provider: nothing else here would use it, and in-process
	// tests would see one command's provider in the next.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	logger.Info("tracing on", "exporter", exporterLabel(exporterName, env))
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			logger.Warn("tracing: flush on exit", "error", err)
		}
	}, nil
}

// newSpanExporter makes the exporter OTEL_TRACES_EXPORTER names. Not
// contrib's autoexport: its console exporter writes to stdout, which is
// the stdio transport here, and it pulls in the metric and log exporters.
func newSpanExporter(ctx context.Context, env *environment, name string, stderr io.Writer) (sdktrace.SpanExporter, error) {
	switch name {
	case "", "otlp":
		proto := env.getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if proto == "" {
			proto = env.getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch proto {
		case "", "http/protobuf":
			return otlptracehttp.New(ctx)
		case "grpc":
			return otlptracegrpc.New(ctx)
		default:
			return nil, usagef("OTEL_EXPORTER_OTLP_PROTOCOL=%s: want http/protobuf or grpc", proto)
		}
	case "console":
		return stdouttrace.New(stdouttrace.WithWriter(stderr))
	default:
		return nil, usagef("OTEL_TRACES_EXPORTER=%s: want otlp, console or none", name)
	}
}

func exporterLabel(name string, env *environment) string {
	if name == "console" {
		return "console (stderr)"
	}
	proto := env.getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = env.getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto == "" {
		proto = "http/protobuf"
	}
	return "otlp " + proto
}
