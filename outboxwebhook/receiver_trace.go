package outboxwebhook

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tracing"
)

var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

// startSpan starts the CONSUMER span of handling msg: a child of the span
// in ctx when that one is of the message's trace (an HTTP server span that
// read the same traceparent), else of the message's trace context, with the
// span in ctx linked. It returns ctx and a nil span when tracing is off.
func (rc *Receiver) startSpan(ctx context.Context, msg *outbox.Message) (context.Context, trace.Span) {
	if rc.tracer == nil {
		return ctx, nil
	}
	parent, links := tracing.ConsumerStart(ctx, msg.Headers)
	opts := []trace.SpanStartOption{consumerKind}
	if len(links) > 0 {
		opts = append(opts, trace.WithLinks(links...))
	}
	ctx, span := rc.tracer.Start(parent, "receive "+msg.AggregateType, opts...)
	if span.IsRecording() {
		span.SetAttributes(tracing.MessageAttributes(msg.ID.String(), msg.AggregateType, msg.AggregateID, msg.Type, msg.Sequence)...)
		span.SetAttributes(semconv.MessagingSystemKey.String("webhook"), semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("receive"))
	}
	return ctx, span
}

// endSpan records handle's error on span and ends it.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
