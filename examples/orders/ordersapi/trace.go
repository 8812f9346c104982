package ordersapi

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the API's spans.
const tracerName = "github.com/pgoutbox/outbox/examples/orders/ordersapi"

// traced wraps the API's mux in a SERVER span per request, hand-rolled with
// the OpenTelemetry API (otelhttp would do the same with more
// dependencies). The span continues the trace of an incoming traceparent
// header and rides in the request's context down to the outbox writer,
// which stores it with the event: that is how the relay's publish and the
// consumer join the request's trace.
func traced(tp trace.TracerProvider, mux *http.ServeMux) http.Handler {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	tracer := tp.Tracer(tracerName)
	prop := propagation.TraceContext{} // stateless; the global propagator is not read
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		// The route is known once the mux has matched the request; it
		// names the span then.
		_, pattern := mux.Handler(r)
		name := r.Method
		if pattern != "" {
			name = pattern
		}
		ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		if span.IsRecording() {
			span.SetAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path))
			if pattern != "" {
				span.SetAttributes(semconv.HTTPRoute(pattern))
			}
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		mux.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(semconv.HTTPResponseStatusCode(sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, strconv.Itoa(sw.status))
		}
	})
}

// statusWriter remembers the status code of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
