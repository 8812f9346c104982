package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

func spanAttrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// TestHandleSpan: Handle and HandleMessage run in a CONSUMER span that
// continues the message's trace, records the outcome, and is the parent of
// the spans the effect starts from its ctx.
func TestHandleSpan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "c1", TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	_, producer := tp.Tracer("test").Start(ctx, "send order", trace.WithSpanKind(trace.SpanKindProducer))
	producer.End()
	psc := producer.SpanContext()
	withTrace := func(m outbox.Message) outbox.Message {
		m.Headers = map[string]string{"traceparent": traceparent(psc)}
		return m
	}
	last := func() sdktrace.ReadOnlySpan { e := rec.Ended(); return e[len(e)-1] }

	m1 := withTrace(msg("o1", 1))
	got, err := in.Handle(ctx, m1, func(ctx context.Context, tx pgx.Tx) error {
		_, child := tp.Tracer("business").Start(ctx, "reserve stock")
		child.End()
		return nil
	})
	if err != nil || got != inbox.Applied {
		t.Fatalf("Handle: %v, %v", got, err)
	}
	spans := rec.Ended()
	child, consumer := spans[len(spans)-2], spans[len(spans)-1]
	if consumer.SpanKind() != trace.SpanKindConsumer || consumer.Parent().SpanID() != psc.SpanID() || consumer.SpanContext().TraceID() != psc.TraceID() {
		t.Errorf("inbox span: kind %s, parent %s; want consumer, child of the producer %s", consumer.SpanKind(), consumer.Parent().SpanID(), psc.SpanID())
	}
	if child.Parent().SpanID() != consumer.SpanContext().SpanID() {
		t.Errorf("the effect's span is a child of %s, want the inbox span %s", child.Parent().SpanID(), consumer.SpanContext().SpanID())
	}
	a := spanAttrs(consumer)
	for k, want := range map[string]string{
		"outbox.inbox.outcome": "applied", "messaging.message.id": m1.ID.String(), "messaging.consumer.group.name": "c1",
		"outbox.aggregate.type": "order", "outbox.aggregate.id": "o1", "outbox.aggregate.sequence": "1",
	} {
		if a[k] != want {
			t.Errorf("attribute %s = %q, want %q", k, a[k], want)
		}
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	if _, err := in.Handle(ctx, m1, noop); err != nil {
		t.Fatal(err)
	}
	if got := spanAttrs(last())["outbox.inbox.outcome"]; got != "duplicate" {
		t.Errorf("redelivery: outcome attribute %q, want duplicate", got)
	}
	if _, err := in.HandleMessage(ctx, withTrace(msg("o1", 3)), func(context.Context, pgx.Tx, outbox.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := spanAttrs(last())["outbox.inbox.outcome"]; got != "early" {
		t.Errorf("gap: outcome attribute %q, want early", got)
	}
	if _, err := in.Handle(ctx, withTrace(msg("o1", 2)), func(context.Context, pgx.Tx) error { return errors.New("no stock table") }); err == nil {
		t.Fatal("the effect's error was lost")
	}
	if s := last().Status(); s.Code != codes.Error || s.Description != "no stock table" {
		t.Errorf("failed effect: span status %+v", s)
	}

	// Called inside a span of the same trace (a receiver's), the inbox
	// span nests under it; inside one of another trace, it continues the
	// message's trace and links the other.
	outer, receiver := tp.Tracer("test").Start(trace.ContextWithRemoteSpanContext(ctx, psc), "receive order")
	if _, err := in.Handle(outer, withTrace(msg("o2", 1)), noop); err != nil {
		t.Fatal(err)
	}
	receiver.End()
	if p := rec.Ended()[len(rec.Ended())-2].Parent().SpanID(); p != receiver.SpanContext().SpanID() {
		t.Errorf("inside a span of the same trace: parent %s, want that span %s", p, receiver.SpanContext().SpanID())
	}
	other, unrelated := tp.Tracer("test").Start(ctx, "poll loop")
	if _, err := in.Handle(other, withTrace(msg("o3", 1)), noop); err != nil {
		t.Fatal(err)
	}
	unrelated.End()
	s := rec.Ended()[len(rec.Ended())-2]
	if s.Parent().SpanID() != psc.SpanID() || len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != unrelated.SpanContext().SpanID() {
		t.Errorf("inside a span of another trace: parent %s, links %v; want the producer and a link to that span", s.Parent().SpanID(), s.Links())
	}
}
