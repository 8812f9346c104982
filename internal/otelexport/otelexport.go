// Package otelexport gives the binaries (outbox relay, orders api, orders
// inventory) the tracer provider the standard OpenTelemetry environment
// variables ask for. The library itself never uses it: a library user
// builds and passes a provider of their own.
//
// OTEL_TRACES_EXPORTER selects the exporter: unset or "none" turns tracing
// off (the binaries then record nothing), "console" writes each finished
// span as one JSON object per line. Exporters that need a network protocol
// ("otlp", "zipkin") are not built in, to keep gRPC and its generated code
// out of the module; such a value is an error that says so. OTEL_SERVICE_NAME
// and OTEL_RESOURCE_ATTRIBUTES are honoured.
package otelexport

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// EnvExporter names the environment variable that selects the exporter.
const EnvExporter = "OTEL_TRACES_EXPORTER"

// FromEnv returns the tracer provider OTEL_TRACES_EXPORTER asks for, for a
// service called service unless OTEL_SERVICE_NAME says otherwise, and the
// function that flushes and stops it (call it on exit). The provider is nil
// when tracing is off: the components then fall back to the global
// provider, a no-op, as nothing sets it. Console spans go to w. No global is
// set.
func FromEnv(ctx context.Context, service string, w io.Writer) (trace.TracerProvider, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	switch v := strings.TrimSpace(os.Getenv(EnvExporter)); v {
	case "", "none":
		return nil, none, nil
	case "console":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(w))
		if err != nil {
			return nil, none, fmt.Errorf("%s=console: %w", EnvExporter, err)
		}
		res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName(service)), resource.WithFromEnv())
		if err != nil {
			return nil, none, fmt.Errorf("%s: resource: %w", EnvExporter, err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		return tp, tp.Shutdown, nil
	default:
		return nil, none, fmt.Errorf("%s=%q is not built into this binary (use console or none; to export over OTLP, build a program on the library with the exporter of your choice: docs/operations.md, Tracing)", EnvExporter, v)
	}
}

// Stop calls stop (FromEnv's) with ctx's values but not its cancellation,
// for at most five seconds: it runs on the way out, after SIGTERM.
func Stop(ctx context.Context, stop func(context.Context) error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = stop(sctx)
}
