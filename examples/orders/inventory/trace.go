package inventory

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
)

const tracerName = "github.com/pgoutbox/outbox/examples/orders/inventory"

func tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// startEffect starts the span of the stock change: business code adding its
// own span inside the inbox's, from the ctx the inbox hands it.
func (c *Consumer) startEffect(ctx context.Context, msg outbox.Message) (context.Context, trace.Span) {
	name := "inventory " + msg.Type
	switch msg.Type {
	case orderevents.OrderCreated:
		name = "reserve stock"
	case orderevents.OrderCancelled:
		name = "release stock"
	}
	ctx, span := c.trace.Start(ctx, name)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("order.id", msg.AggregateID))
	}
	return ctx, span
}

func endEffect(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
