package inbox

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/tracing"
)

var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

// startSpan starts the CONSUMER span of handling msg (see the package
// documentation, "Tracing"). It returns ctx and a nil span when tracing is
// off.
func (in *Inbox) startSpan(ctx context.Context, msg outbox.Message) (context.Context, trace.Span) {
	if in.tracer == nil {
		return ctx, nil
	}
	parent, links := tracing.ConsumerStart(ctx, msg.Headers)
	opts := []trace.SpanStartOption{consumerKind}
	if len(links) > 0 {
		opts = append(opts, trace.WithLinks(links...))
	}
	ctx, span := in.tracer.Start(parent, "process "+msg.AggregateType, opts...)
	if span.IsRecording() {
		span.SetAttributes(tracing.MessageAttributes(msg.ID.String(), msg.AggregateType, msg.AggregateID, msg.Type, msg.Sequence)...)
		span.SetAttributes(semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
			semconv.MessagingConsumerGroupName(in.consumer))
	}
	return ctx, span
}

// endSpan records the outcome of a Handle on span and ends it.
func endSpan(span trace.Span, outcome Outcome, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(tracing.OutcomeKey.String(outcome.String()))
	}
	span.End()
}
