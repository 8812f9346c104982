package outboxamqp_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// Example publishes an event to RabbitMQ and reads it back as a consumer
// would. It runs against the broker at 127.0.0.1:5672 (RABBITMQ_URL), on an
// exchange and a queue of its own.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exchange, queue := rabbittest.UniqueName("example"), rabbittest.UniqueName("example-orders")

	p, err := outboxamqp.NewPublisher(outboxamqp.Config{
		URL:        rabbittest.URL(),
		Exchange:   exchange, // declared as a durable topic exchange
		RoutingKey: "shop.{aggregate_type}",
		Source:     "/orders",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	if err := p.Probe(ctx); err != nil {
		fmt.Println(err)
		return
	}

	// A consumer binds its queue before events are published: a message no
	// queue is bound for fails as its route being unavailable (the relay
	// holds it, spending no attempt, until a queue is bound).
	conn, err := amqp.Dial(rabbittest.URL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ch.QueueDelete(queue, false, false, false)
	defer ch.ExchangeDelete(exchange, false, false)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		fmt.Println(err)
		return
	}
	if err := ch.QueueBind(queue, "shop.order", exchange, false, nil); err != nil {
		fmt.Println(err)
		return
	}

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
	lost := msg
	lost.ID, lost.AggregateType = uuid.MustParse("0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c"), "invoice"
	errs := p.Publish(ctx, []outbox.Message{msg, lost})
	fmt.Println("order:", errs[0])
	route, _ := outbox.UnavailableRoute(errs[1])
	fmt.Println("invoice route unavailable:", route, "permanent:", outbox.IsPermanent(errs[1]))

	d, ok, err := ch.Get(queue, true)
	if err != nil || !ok {
		fmt.Println("no message", err)
		return
	}
	got, err := outboxamqp.Decode(d)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("routing key:", d.RoutingKey, "message-id:", d.MessageId, "persistent:", d.DeliveryMode == amqp.Persistent)
	for _, k := range []string{"cloudEvents:id", "cloudEvents:type", "cloudEvents:source", "cloudEvents:subject", "cloudEvents:time", "cloudEvents:sequence"} {
		fmt.Printf("%s: %s\n", k, d.Headers[k])
	}
	fmt.Println("content-type:", d.ContentType)
	fmt.Println("decoded:", got.AggregateType, got.AggregateID, got.Sequence, got.Type, string(got.Payload), got.Headers["traceparent"])
	// Output:
	// order: <nil>
	// invoice route unavailable: shop.invoice permanent: false
	// routing key: shop.order message-id: 0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b persistent: true
	// cloudEvents:id: 0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b
	// cloudEvents:type: OrderCreated
	// cloudEvents:source: /orders
	// cloudEvents:subject: o-42
	// cloudEvents:time: 2026-01-02T03:04:05Z
	// cloudEvents:sequence: 00000000000000000001
	// content-type: application/json
	// decoded: order o-42 1 OrderCreated {"total":1299} 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}

// ExampleRoutingKey shows how an event's aggregate becomes a routing key.
func ExampleRoutingKey() {
	fmt.Println(outboxamqp.RoutingKey("outbox.{aggregate_type}", "order", "o-42"))
	fmt.Println(outboxamqp.RoutingKey("shop.{aggregate_type}.{aggregate_id}", "order", "o-42"))
	// Output:
	// outbox.order <nil>
	// shop.order.o-42 <nil>
}

// ExampleParseURL reads a destination URL; the password is redacted when the
// configuration is printed.
func ExampleParseURL() {
	cfg, err := outboxamqp.ParseURL("amqp://relay:s3cret@mq.internal:5672/shop?exchange=events&routing_key=shop.{aggregate_type}")
	fmt.Println(err)
	fmt.Println(cfg)
	// Output:
	// <nil>
	// {URL:amqp://relay:xxxxx@mq.internal:5672/shop Exchange:events NoDeclare:false RoutingKey:shop.{aggregate_type} Source: ConfirmTimeout:0s DialTimeout:0s MaxMessageBytes:0 CAFile: CertFile: KeyFile: TLSConfig:false}
}
