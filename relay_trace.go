package outbox

// Tracing the publish: one PRODUCER span per event sent, a child of the
// trace context the writer stored in the event's headers, whose own context
// travels in the message's traceparent. The argument: docs/operations.md,
// "Tracing".

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox/internal/tracing"
)

// MessagingDescriber is implemented by a Publisher that can name, for the
// relay's spans, its messaging system and where a message goes. Every
// destination of this module implements it. It must be cheap and safe for
// concurrent use.
type MessagingDescriber interface {
	// MessagingSystem is the messaging.system span attribute ("nats",
	// "kafka", "rabbitmq", "webhook").
	MessagingSystem() string
	// MessagingDestination is the messaging.destination.name of msg (a
	// subject, topic or exchange), or "" when there is none worth naming.
	MessagingDestination(msg *Message) string
}

// publishTracer starts the relay's producer spans.
type publishTracer struct {
	tracer trace.Tracer
	system attribute.KeyValue // zero Key when the publisher does not say
	dest   MessagingDescriber // nil when the publisher does not say
}

// newPublishTracer returns nil when tp is a no-op provider.
func newPublishTracer(tp trace.TracerProvider, pub Publisher) *publishTracer {
	t := tracing.Tracer(tp)
	if t == nil {
		return nil
	}
	pt := &publishTracer{tracer: t}
	if d, ok := pub.(MessagingDescriber); ok {
		pt.dest = d
		pt.system = semconv.MessagingSystemKey.String(d.MessagingSystem())
	}
	return pt
}

var producerKind = trace.WithSpanKind(trace.SpanKindProducer)

// start starts the span of publishing msg and points msg's trace context at
// it (a copy of its headers: the claimed event's map is left alone). The
// span is a child of the trace context stored with the event, or a root
// when there is none. When the tracer made no span of its own (a global
// provider still a no-op), msg is unchanged; spans[i] is then a no-op span.
func (pt *publishTracer) start(msg *Message) trace.Span {
	parent := tracing.FromHeaders(msg.Headers)
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	dest := ""
	if pt.dest != nil {
		dest = pt.dest.MessagingDestination(msg)
	}
	// The destination name may hold the aggregate id (a NATS subject):
	// the span is named after the aggregate type, which stays few.
	_, span := pt.tracer.Start(ctx, "send "+msg.AggregateType, producerKind)
	if span.IsRecording() {
		attrs := tracing.MessageAttributes(msg.ID.String(), msg.AggregateType, msg.AggregateID, msg.Type, msg.Sequence)
		attrs = append(attrs, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
			tracing.AttemptKey.Int(msg.Attempt))
		if pt.system.Key != "" {
			attrs = append(attrs, pt.system)
		}
		if dest != "" {
			attrs = append(attrs, semconv.MessagingDestinationName(dest))
		}
		span.SetAttributes(attrs...)
	}
	if sc := span.SpanContext(); sc.IsValid() && !sc.Equal(parent) {
		msg.Headers = tracing.WithSpanContext(msg.Headers, sc)
	}
	return span
}

// startAll starts the spans of msgs (see start); nil when tracing is off.
func (pt *publishTracer) startAll(msgs []Message) []trace.Span {
	if pt == nil {
		return nil
	}
	spans := make([]trace.Span, len(msgs))
	for i := range msgs {
		spans[i] = pt.start(&msgs[i])
	}
	return spans
}

// endAll ends spans with the outcome of each publish: errs as Publish
// returned it (nil when all succeeded).
func endAll(spans []trace.Span, errs []error) {
	for i, span := range spans {
		if errs != nil && i < len(errs) && errs[i] != nil {
			span.RecordError(errs[i])
			span.SetStatus(codes.Error, errs[i].Error())
		}
		span.End()
	}
}
