package outboxwebhook_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// TestReceiverContinuesTrace: a Receiver with a tracer provider handles
// each event in a CONSUMER span whose parent is the span the message's
// traceparent names (the relay's publish), and handle's ctx carries it.
func TestReceiverContinuesTrace(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	// The producer: a span of the SDK, whose context the message carries.
	_, producer := tp.Tracer("test").Start(context.Background(), "send order", trace.WithSpanKind(trace.SpanKindProducer))
	producer.End()
	psc := producer.SpanContext()

	secret := newSecret(t)
	var inHandle trace.SpanContext
	fail := false
	rc, err := outboxwebhook.NewReceiver([]string{secret}, func(ctx context.Context, m outbox.Message) error {
		inHandle = trace.SpanContextFromContext(ctx)
		if fail {
			return errors.New("stock table locked")
		}
		return nil
	}, outboxwebhook.ReceiverOptions{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{secret}})

	m := message("o-1", 1)
	m.Headers = map[string]string{"traceparent": "00-" + psc.TraceID().String() + "-" + psc.SpanID().String() + "-01"}
	if err := publishOne(t, p, m); err != nil {
		t.Fatal(err)
	}
	var consumer sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindConsumer {
			consumer = s
		}
	}
	if consumer == nil {
		t.Fatal("no consumer span")
	}
	if consumer.Parent().SpanID() != psc.SpanID() || consumer.SpanContext().TraceID() != psc.TraceID() {
		t.Errorf("consumer span's parent is %s, want the producer %s", consumer.Parent().SpanID(), psc.SpanID())
	}
	if inHandle.SpanID() != consumer.SpanContext().SpanID() {
		t.Errorf("handle's ctx carries span %s, want the consumer span %s", inHandle.SpanID(), consumer.SpanContext().SpanID())
	}
	if got := attrs(consumer)["messaging.message.id"]; got != m.ID.String() {
		t.Errorf("messaging.message.id = %q, want %s", got, m.ID)
	}

	// A failed handle ends the span with an error.
	fail = true
	m2 := message("o-1", 2)
	m2.Headers = m.Headers
	if err := publishOne(t, p, m2); err == nil {
		t.Fatal("the publish of a failed handle succeeded")
	}
	last := rec.Ended()[len(rec.Ended())-1]
	if last.Status().Code != codes.Error || last.Status().Description != "stock table locked" {
		t.Errorf("failed handle: span status %+v", last.Status())
	}
}

// TestReceiverWithoutTracerProvider: with none configured, handle's ctx
// holds no span of the receiver's own (at most the message's context, as a
// no-op span).
func TestReceiverWithoutTracerProvider(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	var inHandle trace.Span
	rc, err := outboxwebhook.NewReceiver([]string{secret}, func(ctx context.Context, m outbox.Message) error {
		inHandle = trace.SpanFromContext(ctx)
		return nil
	}, outboxwebhook.ReceiverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	p := publisher(t, outboxwebhook.Config{URL: srv.URL, Secrets: []string{secret}})
	m := message("o-1", 1)
	m.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	if err := publishOne(t, p, m); err != nil {
		t.Fatal(err)
	}
	if inHandle.IsRecording() {
		t.Error("a span is recording without a tracer provider")
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}
