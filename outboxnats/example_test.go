package outboxnats_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxnats"
)

// Example publishes an event to the NATS server at nats://127.0.0.1:4222 (or
// NATS_URL) and reads it back as a consumer would.
func Example() {
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A stream and prefix of its own, so that the example shares the server.
	run := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	cfg := outboxnats.Config{Stream: "EXAMPLE_" + run, SubjectPrefix: "example_" + run, Source: "/orders"}
	p, err := outboxnats.NewPublisher(ctx, js, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = js.DeleteStream(ctx, cfg.Stream) }()

	msg := outbox.Message{
		ID:            uuid.MustParse("0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
		AggregateType: "order",
		AggregateID:   "o-42",
		Sequence:      1,
		Type:          "OrderCreated",
		SchemaVersion: 1,
		Payload:       []byte(`{"total":1299}`),
		Headers:       map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		OccurredAt:    time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	if errs := p.Publish(ctx, []outbox.Message{msg}); errs != nil {
		fmt.Println(errs[0])
		return
	}

	// A consumer reads the order's latest event back.
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		fmt.Println(err)
		return
	}
	subject := outboxnats.Subject(cfg.SubjectPrefix, "order", "o-42")
	raw, err := stream.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		fmt.Println(err)
		return
	}
	got, err := outboxnats.Decode(raw.Header, raw.Data)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("subject:", strings.TrimPrefix(raw.Subject, cfg.SubjectPrefix))
	for _, h := range []string{"ce-id", "ce-type", "ce-source", "ce-subject", "ce-time", "ce-sequence", "Nats-Msg-Id"} {
		fmt.Printf("%s: %s\n", h, raw.Header.Get(h))
	}
	fmt.Println("decoded:", got.AggregateType, got.AggregateID, got.Sequence, got.Type, string(got.Payload), got.Headers["traceparent"])
	// Output:
	// subject: .order.o-42
	// ce-id: 0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b
	// ce-type: OrderCreated
	// ce-source: /orders
	// ce-subject: o-42
	// ce-time: 2026-01-02T03:04:05Z
	// ce-sequence: 00000000000000000001
	// Nats-Msg-Id: 0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b
	// decoded: order o-42 1 OrderCreated {"total":1299} 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}

// ExampleSubject shows how aggregate types and ids become subject tokens.
func ExampleSubject() {
	fmt.Println(outboxnats.Subject("outbox", "order", "o-42"))
	fmt.Println(outboxnats.Subject("outbox", "order", "eu.42 *"))
	fmt.Println(outboxnats.AggregateTypeFilter("outbox", "order"))
	// Output:
	// outbox.order.o-42
	// outbox.order.eu%2E42%20%2A
	// outbox.order.>
}
