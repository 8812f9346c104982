// Package tracing holds what the writer, the relay, the inbox and the
// webhook receiver share to carry the W3C trace context in an event's
// headers and to start their spans: a case-insensitive carrier over
// map[string]string, the span attributes, and the rule a consumer span
// follows to pick its parent.
//
// It reads and writes no OpenTelemetry global: the propagator is the
// stateless propagation.TraceContext, and tracer providers are passed in.
package tracing

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every span the module starts.
const ScopeName = "github.com/pgoutbox/outbox"

// Header names of the W3C trace context.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Attribute keys of the outbox's own span attributes.
const (
	AggregateTypeKey = attribute.Key("outbox.aggregate.type")
	AggregateIDKey   = attribute.Key("outbox.aggregate.id")
	SequenceKey      = attribute.Key("outbox.aggregate.sequence")
	AttemptKey       = attribute.Key("outbox.attempt")
	OutcomeKey       = attribute.Key("outbox.inbox.outcome")
)

// EventTypeKey is the CloudEvents semantic convention's event type.
const EventTypeKey = semconv.CloudEventsEventTypeKey

// Tracer returns the tracer of tp, or nil when tp is a no-op provider (the
// callers then skip tracing altogether). A nil tp means the global provider
// at the time of the call, which is a no-op delegate unless the application
// set one; it is read, never set.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return nil
	}
	return tp.Tracer(ScopeName)
}

// Carrier is a propagation.TextMapCarrier over an event's headers whose Get
// ignores the case of the name (NATS and HTTP may change it).
type Carrier map[string]string

// Get returns the value of key, matched case-insensitively.
func (c Carrier) Get(key string) string {
	if v, ok := c[key]; ok {
		return v
	}
	for k, v := range c {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

// Set sets key, replacing any spelling of it.
func (c Carrier) Set(key, value string) {
	for k := range c {
		if k != key && strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = value
}

// Keys lists the names in the carrier.
func (c Carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Has reports whether the headers hold key, in any spelling.
func Has(headers map[string]string, key string) bool {
	if _, ok := headers[key]; ok {
		return true
	}
	for k := range headers {
		if strings.EqualFold(k, key) {
			return true
		}
	}
	return false
}

// FromHeaders returns the span context the headers carry: invalid when they
// carry none, or a malformed one.
func FromHeaders(headers map[string]string) trace.SpanContext {
	_, sc := ContextFromHeaders(context.Background(), headers)
	return sc
}

// ContextFromHeaders returns ctx with the remote span context the headers
// carry, and that span context; ctx itself and an invalid span context when
// they carry none, or a malformed one.
func ContextFromHeaders(ctx context.Context, headers map[string]string) (context.Context, trace.SpanContext) {
	if len(headers) == 0 {
		return ctx, trace.SpanContext{}
	}
	out := propagation.TraceContext{}.Extract(ctx, Carrier(headers))
	if out == ctx {
		return ctx, trace.SpanContext{}
	}
	return out, trace.SpanContextFromContext(out)
}

// Encode returns the traceparent and tracestate of sc (tracestate empty when
// sc has none); ok is false when sc is not valid.
func Encode(sc trace.SpanContext) (traceparent, tracestate string, ok bool) {
	if !sc.IsValid() {
		return "", "", false
	}
	c := make(Carrier, 2)
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c[HeaderTraceParent], c[HeaderTraceState], c[HeaderTraceParent] != ""
}

// WithSpanContext returns a copy of headers whose traceparent and tracestate
// are sc's (any other spelling of those names dropped). headers itself is
// not modified.
func WithSpanContext(headers map[string]string, sc trace.SpanContext) map[string]string {
	tp, ts, ok := Encode(sc)
	if !ok {
		return headers
	}
	out := make(Carrier, len(headers)+2)
	for k, v := range headers {
		if strings.EqualFold(k, HeaderTraceParent) || strings.EqualFold(k, HeaderTraceState) {
			continue
		}
		out[k] = v
	}
	out[HeaderTraceParent] = tp
	if ts != "" {
		out[HeaderTraceState] = ts
	}
	return out
}

// ConsumerStart returns the context a consumer span starts from, and its
// links. The span continues the message's trace: its parent is the span
// already in ctx when that one belongs to the message's trace (a receiver's
// span around an inbox's, say), else the message's remote span context,
// with the span in ctx (of another trace) linked. Without a trace context in
// the message, ctx is used as it is.
func ConsumerStart(ctx context.Context, headers map[string]string) (context.Context, []trace.Link) {
	remote := FromHeaders(headers)
	if !remote.IsValid() {
		return ctx, nil
	}
	local := trace.SpanContextFromContext(ctx)
	if local.IsValid() && local.TraceID() == remote.TraceID() {
		return ctx, nil
	}
	var links []trace.Link
	if local.IsValid() {
		links = []trace.Link{{SpanContext: local}}
	}
	return trace.ContextWithRemoteSpanContext(ctx, remote), links
}

// MessageAttributes are the attributes every span about one event carries.
func MessageAttributes(id, aggregateType, aggregateID, eventType string, sequence int64) []attribute.KeyValue {
	return []attribute.KeyValue{
		semconv.MessagingMessageID(id),
		AggregateTypeKey.String(aggregateType),
		AggregateIDKey.String(aggregateID),
		SequenceKey.Int64(sequence),
		EventTypeKey.String(eventType),
	}
}
