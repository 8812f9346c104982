package inventory_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestTraceFromRequestToInventory follows one order through the whole
// system with an in-memory span exporter: a client's request (with a
// traceparent header) to the order API, the event the API writes in its
// transaction, a real relay publishing it to NATS, and the inventory
// consumer applying it through its inbox. Every span is of the client's
// trace, each the child of the one before: client → API server span →
// relay's producer span → inbox consumer span → "reserve stock".
func TestTraceFromRequestToInventory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })

	e := newEnv(t)
	e.createStream()
	var err error
	e.cons, err = inventory.New(e.pool, inventory.Config{
		Settings: inventory.Settings{Schema: e.schema, Stream: e.stream, SubjectPrefix: e.prefix, Durable: "inventory-test",
			AckWait: 5 * time.Second, RetryDelay: 50 * time.Millisecond},
		EarlyDelay: 20 * time.Millisecond, TracerProvider: tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.start()

	svc, err := ordersapi.New(e.pool, ordersapi.Config{Schema: e.schema, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(svc.Handler())
	t.Cleanup(api.Close)

	relay, err := outbox.NewRelay(e.pool, outbox.RelayConfig{Schema: e.schema, Publisher: e.pub, TracerProvider: tp,
		PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})

	// The client's span, sent along as a traceparent header.
	cctx, client := tp.Tracer("client").Start(ctx, "place order", trace.WithSpanKind(trace.SpanKindClient))
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, api.URL+"/orders",
		strings.NewReader(`{"customer_id": "c-1", "items": [{"sku": "SKU-1001", "quantity": 2}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	propagation.TraceContext{}.Inject(cctx, propagation.HeaderCarrier(req.Header))
	resp, err := api.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	client.End()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders: %d %s", resp.StatusCode, body)
	}
	var order ordersapi.Order
	if err := json.Unmarshal(body, &order); err != nil {
		t.Fatal(err)
	}

	// The inventory's effect happened.
	outboxtest.Eventually(t, waitFor, "stock reserved for the order", func() bool {
		var n int
		err := e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.inventory_reservations WHERE order_id = $1 AND status = 'reserved'`, e.schema),
			order.ID).Scan(&n)
		return err == nil && n == 1
	})
	find := func(kind trace.SpanKind, name string) sdktrace.ReadOnlySpan {
		for _, s := range rec.Ended() {
			if s.SpanKind() == kind && (name == "" || s.Name() == name) {
				return s
			}
		}
		return nil
	}
	outboxtest.Eventually(t, waitFor, "the consumer's spans ended", func() bool {
		return find(trace.SpanKindConsumer, "") != nil && find(trace.SpanKindInternal, "reserve stock") != nil
	})

	server := find(trace.SpanKindServer, "POST /orders")
	producer := find(trace.SpanKindProducer, "")
	consumer := find(trace.SpanKindConsumer, "")
	effect := find(trace.SpanKindInternal, "reserve stock")
	if server == nil || producer == nil {
		t.Fatalf("missing spans: server %v, producer %v", server != nil, producer != nil)
	}
	chain := []struct {
		name   string
		span   sdktrace.ReadOnlySpan
		parent trace.SpanContext
	}{
		{"API server span", server, client.SpanContext()},
		{"relay producer span", producer, server.SpanContext()},
		{"inbox consumer span", consumer, producer.SpanContext()},
		{"inventory effect span", effect, consumer.SpanContext()},
	}
	for _, c := range chain {
		if c.span.SpanContext().TraceID() != client.SpanContext().TraceID() {
			t.Errorf("%s is in trace %s, want the client's %s", c.name, c.span.SpanContext().TraceID(), client.SpanContext().TraceID())
		}
		if c.span.Parent().SpanID() != c.parent.SpanID() {
			t.Errorf("%s's parent is %s, want %s", c.name, c.span.Parent().SpanID(), c.parent.SpanID())
		}
	}
	attrs := map[string]string{}
	for _, kv := range consumer.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["outbox.inbox.outcome"] != "applied" || attrs["outbox.aggregate.id"] != order.ID {
		t.Errorf("inbox span attributes %v", attrs)
	}
}
