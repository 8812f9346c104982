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

// producerOpts are the options of every producer span (a package variable:
// no allocation per span).
var producerOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}

// start starts the span of publishing msg and points msg's trace context at
// it (a copy of its headers: the claimed event's map is left alone). The
// span is a child of the trace context stored with the event, or a root
// when there is none. noop reports that the tracer made no span of its own
// (the global provider, still a no-op): msg is then unchanged.
func (pt *publishTracer) start(msg *Message) (span trace.Span, noop bool) {
	ctx, parent := tracing.ContextFromHeaders(context.Background(), msg.Headers)
	_, span = pt.tracer.Start(ctx, "send", producerOpts...)
	if span.IsRecording() {
		// The destination name may hold the aggregate id (a NATS subject):
		// the span is named after the aggregate type, which stays few.
		span.SetName("send " + msg.AggregateType)
		dest := ""
		if pt.dest != nil {
			dest = pt.dest.MessagingDestination(msg)
		}
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
	sc := span.SpanContext()
	if sc.Equal(parent) {
		// An SDK gives every span, sampled or not, a span id of its own.
		return span, true
	}
	msg.Headers = tracing.WithSpanContext(msg.Headers, sc)
	return span, false
}

// startAll starts the spans of msgs (see start); nil when tracing is off.
// When the first message shows the tracer to be a no-op (the global
// provider before the application set one), the others are left alone: a
// relay whose application does not trace pays for one span start per
// Publish call, not per event.
func (pt *publishTracer) startAll(msgs []Message) []trace.Span {
	if pt == nil || len(msgs) == 0 {
		return nil
	}
	first, noop := pt.start(&msgs[0])
	if noop {
		return nil
	}
	spans := make([]trace.Span, len(msgs))
	spans[0] = first
	for i := 1; i < len(msgs); i++ {
		spans[i], _ = pt.start(&msgs[i])
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
