package polyglot_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestNodeAMQPConsumer: the Go writer's events (four orders, three events
// each, four transactions rolled back) are published by a relay to an
// exchange of the test's own, and consumer-amqp.js (npm amqplib and pg)
// applies each from a queue bound to it once, in sequence order, with every
// CloudEvents attribute of the AMQP binding as documented (no partition
// key: the binding carries none).
func TestNodeAMQPConsumer(t *testing.T) {
	t.Parallel()
	needNodeModules(t, "amqplib", "pg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	rolledBack := writeOrders(t, ctx, pool, schema)

	url := rabbittest.URL()
	exchange, queue := rabbittest.UniqueName("polyglot-x"), rabbittest.UniqueName("polyglot-q")
	pub, err := outboxamqp.NewPublisher(outboxamqp.Config{URL: url, Exchange: exchange, Source: source})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	if err := pub.Probe(ctx); err != nil { // declares the exchange
		t.Fatalf("RabbitMQ at %s: %v (start it: .ci/setup)", "127.0.0.1:5672", err)
	}
	ch, err := rabbittest.Conn(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "outbox.order", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	runRelay(t, ctx, pool, schema, pub)

	lines, wait := startNode(t, ctx, append(nodeEnv(schema), "RABBITMQ_URL="+url), "consumer-amqp.js", queue, "billing", itoa(expected))
	var report nodeReport
	lastJSON(t, lines, wait, &report)
	checkReport(t, report)
	checkReceived(t, ctx, pool, schema, "billing", rolledBack, false, time.Microsecond)
}
