package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// spanContext is a valid, sampled remote span context with a trace state.
func spanContext(t *testing.T) trace.SpanContext {
	t.Helper()
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		TraceState: ts,
		Remote:     true,
	})
}

const wantTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// recorder returns a tracer provider of the SDK recording every span in
// memory. Nothing global is set.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// globals describes the OpenTelemetry globals, to show they were not touched.
func globals() string {
	return fmt.Sprintf("%T %T", otel.GetTracerProvider(), otel.GetTextMapPropagator())
}

// TestWriterTraceContext: the writer copies the caller's W3C trace context
// into each event's headers, on every write path, unless there is none, the
// event sets its own, or the writer was told not to.
func TestWriterTraceContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	traced := trace.ContextWithSpanContext(ctx, spanContext(t))
	before := globals()

	type write func(ctx context.Context, w *outbox.Writer, evs ...outbox.Event) []outbox.Recorded
	viaPgx := func(ctx context.Context, w *outbox.Writer, evs ...outbox.Event) []outbox.Recorded {
		var recs []outbox.Recorded
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			recs, err = w.InsertTx(ctx, tx, evs...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	viaSQL := func(ctx context.Context, w *outbox.Writer, evs ...outbox.Event) []outbox.Recorded {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		recs, err := w.InsertSQLTx(ctx, tx, evs...)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return recs
	}
	headersOf := func(t *testing.T, rec outbox.Recorded) map[string]string {
		t.Helper()
		m, err := outbox.ReadMessage(ctx, pool, schema, rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		return m.Headers
	}
	w := newWriter(t, schema)
	off, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, DisableTraceContext: true})
	if err != nil {
		t.Fatal(err)
	}

	for name, wr := range map[string]write{"pgx": viaPgx, "database/sql": viaSQL} {
		t.Run(name, func(t *testing.T) {
			for _, n := range []int{1, 2} { // the single-event and the general statement
				t.Run(fmt.Sprintf("%d events", n), func(t *testing.T) {
					evs := make([]outbox.Event, n)
					for i := range evs {
						evs[i] = orderEvent(fmt.Sprintf("o-%s-%d-%d", name, n, i), "OrderCreated")
					}
					evs[0].Headers = map[string]string{"x-tenant": "t1"}

					for _, rec := range wr(traced, w, evs...) {
						h := headersOf(t, rec)
						if h["traceparent"] != wantTraceParent || h["tracestate"] != "vendor=abc" {
							t.Errorf("traced write stored headers %v, want traceparent %s and tracestate vendor=abc", h, wantTraceParent)
						}
					}
					if h := headersOf(t, wr(traced, w, evs...)[0]); h["x-tenant"] != "t1" {
						t.Errorf("the event's own header was lost: %v", h)
					}
					if len(evs[0].Headers) != 1 {
						t.Errorf("the caller's header map was modified: %v", evs[0].Headers)
					}
					for _, rec := range wr(ctx, w, evs...) {
						if h := headersOf(t, rec); h["traceparent"] != "" || h["tracestate"] != "" {
							t.Errorf("a write without a trace stored trace headers: %v", h)
						}
					}
					for _, rec := range wr(traced, off, evs...) {
						if h := headersOf(t, rec); h["traceparent"] != "" || h["tracestate"] != "" {
							t.Errorf("DisableTraceContext: stored trace headers %v", h)
						}
					}
					// An explicit traceparent, in any spelling, wins, and
					// brings no foreign tracestate along.
					own := "00-11111111111111111111111111111111-2222222222222222-01"
					evs[0].Headers = map[string]string{"Traceparent": own}
					h := headersOf(t, wr(traced, w, evs...)[0])
					if h["Traceparent"] != own || h["traceparent"] != "" || h["tracestate"] != "" {
						t.Errorf("explicit Traceparent: stored %v, want only the caller's", h)
					}
					// An explicit tracestate is kept beside the injected parent.
					evs[0].Headers = map[string]string{"tracestate": "mine=1"}
					h = headersOf(t, wr(traced, w, evs...)[0])
					if h["traceparent"] != wantTraceParent || h["tracestate"] != "mine=1" {
						t.Errorf("explicit tracestate: stored %v", h)
					}
				})
			}
		})
	}
	// An event with MaxHeaders headers of its own is written without the
	// trace context rather than refused.
	full := orderEvent("o-full", "OrderCreated")
	full.Headers = map[string]string{}
	for i := range outbox.MaxHeaders {
		full.Headers[fmt.Sprintf("h%d", i)] = "v"
	}
	if h := headersOf(t, viaPgx(traced, w, full)[0]); len(h) != outbox.MaxHeaders || h["traceparent"] != "" {
		t.Errorf("an event at the header limit stored %d headers (traceparent %q)", len(h), h["traceparent"])
	}
	if after := globals(); after != before {
		t.Errorf("OpenTelemetry globals changed: %s, then %s", before, after)
	}
}

// attrs collects a span's attributes.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestRelayProducerSpan: the relay publishes each event in a PRODUCER span,
// child of the writer's trace, with the messaging attributes, and the
// message that reaches NATS carries the span's context as its traceparent.
func TestRelayProducerSpan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	tp, rec := recorder(t)
	w := newWriter(t, schema)

	writer := spanContext(t)
	var recs []outbox.Recorded
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		recs, err = w.InsertTx(trace.ContextWithSpanContext(ctx, writer), tx, orderEvent("o-1", "OrderCreated"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// An event written without a trace gets a root span.
	untraced := writeEvents(t, pool, w, 1, 1)[0]

	cfg := quietConfig(schema, b.pub)
	cfg.TracerProvider = tp
	_, stop := startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 10*time.Second, "events published", func() bool { return unpublished(t, pool, schema) == 0 })
	stop()

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want 2 (one per event)", len(spans))
	}
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[attrs(s)["messaging.message.id"].AsString()] = s
	}
	s := byID[recs[0].ID.String()]
	if s == nil {
		t.Fatalf("no span for event %s", recs[0].ID)
	}
	if s.SpanKind() != trace.SpanKindProducer {
		t.Errorf("span kind %s, want producer", s.SpanKind())
	}
	if s.Parent().SpanID() != writer.SpanID() || s.SpanContext().TraceID() != writer.TraceID() {
		t.Errorf("producer span's parent is %s/%s, want the writer's %s/%s", s.Parent().TraceID(), s.Parent().SpanID(), writer.TraceID(), writer.SpanID())
	}
	a := attrs(s)
	for k, want := range map[attribute.Key]string{
		"messaging.system":           "nats",
		"messaging.destination.name": b.prefix + ".order.o-1",
		"messaging.operation.type":   "send",
		"outbox.aggregate.type":      "order",
		"outbox.aggregate.id":        "o-1",
		"cloudevents.event_type":     "OrderCreated",
	} {
		if got := a[k].Emit(); got != want {
			t.Errorf("attribute %s = %q, want %q", k, got, want)
		}
	}
	if a["outbox.aggregate.sequence"].AsInt64() != 1 {
		t.Errorf("attribute outbox.aggregate.sequence = %v, want 1", a["outbox.aggregate.sequence"].Emit())
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("status %v, want unset", s.Status())
	}
	if root := byID[untraced.ID.String()]; root == nil || root.Parent().IsValid() {
		t.Errorf("the untraced event's span should be a root span: %v", root)
	}

	// What reached the broker continues from the producer span.
	for _, m := range b.streamEvents(t) {
		span := byID[m.ID.String()]
		want := fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID())
		if got := m.Headers["traceparent"]; got != want {
			t.Errorf("event %s reached NATS with traceparent %q, want the producer span's %q", m.ID, got, want)
		}
	}
	if m, err := outbox.ReadMessage(ctx, pool, schema, recs[0].ID); err != nil || m.Headers["traceparent"] != wantTraceParent {
		t.Errorf("the stored trace context changed: %v, %v", m.Headers, err)
	}
}

// TestRelayProducerSpanFailure: a failed publish ends its span with an
// error status.
func TestRelayProducerSpanFailure(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	tp, rec := recorder(t)
	w := newWriter(t, schema)
	writeEvents(t, pool, w, 1, 1)
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = outbox.Permanent(errors.New("refused by schema"))
		}
		return errs
	})
	cfg := quietConfig(schema, pub)
	cfg.TracerProvider = tp
	_, stop := startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 10*time.Second, "a span ended", func() bool { return len(rec.Ended()) > 0 })
	stop()
	s := rec.Ended()[0]
	if s.Status().Code != codes.Error || s.Status().Description != "permanent: refused by schema" {
		t.Errorf("status %+v, want an error with the publish's message", s.Status())
	}
	if _, ok := attrs(s)["messaging.system"]; ok {
		t.Errorf("a publisher that does not describe itself got a messaging.system attribute")
	}
}

// TestRelayWithoutTracerProvider: with no provider configured (and none set
// globally) the relay makes no span: the message goes out with the trace
// context the writer stored, and no OpenTelemetry global is touched.
func TestRelayWithoutTracerProvider(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	before := globals()
	w := newWriter(t, schema)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(trace.ContextWithSpanContext(ctx, spanContext(t)), tx, orderEvent("o-1", "OrderCreated"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan map[string]string, 1)
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		for _, m := range msgs {
			select {
			case got <- m.Headers:
			default:
			}
		}
		return nil
	})
	_, stop := startRelay(t, pool, quietConfig(schema, pub))
	h := <-got
	stop()
	if h["traceparent"] != wantTraceParent || h["tracestate"] != "vendor=abc" {
		t.Errorf("without a tracer provider the message went out with %v, want the writer's trace context unchanged", h)
	}
	if after := globals(); after != before {
		t.Errorf("OpenTelemetry globals changed: %s, then %s", before, after)
	}
}

// pipeliner is a Publisher that declares ordered pipelining and records the
// traceparent of every message it accepts.
type pipeliner struct {
	got chan string
}

func (p pipeliner) OrderedPipelining() bool { return true }

func (p pipeliner) Publish(ctx context.Context, msgs []outbox.Message) []error {
	for _, m := range msgs {
		p.got <- m.Headers["traceparent"]
	}
	return nil
}

// TestRelayProducerSpanPipelined: a destination that takes a lane's events
// in one call (Kafka) gets a span per event too, each message carrying its
// own span's context.
func TestRelayProducerSpanPipelined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	tp, rec := recorder(t)
	w := newWriter(t, schema)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(trace.ContextWithSpanContext(ctx, spanContext(t)), tx,
			orderEvent("o-1", "A"), orderEvent("o-1", "B"), orderEvent("o-1", "C"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	pub := pipeliner{got: make(chan string, 10)}
	cfg := quietConfig(schema, pub)
	cfg.TracerProvider = tp
	_, stop := startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 10*time.Second, "events published", func() bool { return unpublished(t, pool, schema) == 0 })
	stop()
	spans := map[string]bool{}
	for _, s := range rec.Ended() {
		if s.Parent().SpanID() != spanContext(t).SpanID() {
			t.Errorf("span %s: parent %s, want the writer's", s.Name(), s.Parent().SpanID())
		}
		spans[fmt.Sprintf("00-%s-%s-01", s.SpanContext().TraceID(), s.SpanContext().SpanID())] = true
	}
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	for range 3 {
		if tp := <-pub.got; !spans[tp] {
			t.Errorf("a message went out with traceparent %q, not one of the spans'", tp)
		}
	}
}
