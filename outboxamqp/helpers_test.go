package outboxamqp_test

import (
	"bytes"
	"context"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func event(aggregateID string, seq int64) outbox.Message {
	return outbox.Message{
		ID:            uuid.Must(uuid.NewV7()),
		AggregateType: "order",
		AggregateID:   aggregateID,
		Sequence:      seq,
		Type:          "OrderCreated",
		SchemaVersion: 1,
		ContentType:   outbox.ContentTypeJSON,
		Payload:       []byte(`{"n":1}`),
		OccurredAt:    time.Now().UTC(),
		Attempt:       1,
	}
}

func checkNil(t *testing.T, errs []error) {
	t.Helper()
	if errs != nil {
		t.Fatalf("Publish errors: %v", errs)
	}
}

func sameMessage(a, b outbox.Message) bool {
	return a.ID == b.ID && a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.Sequence == b.Sequence && a.Type == b.Type && a.SchemaVersion == b.SchemaVersion &&
		a.ContentType == b.ContentType && bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.Headers, b.Headers) &&
		a.OccurredAt.Equal(b.OccurredAt) && a.SkippedFrom == b.SkippedFrom && a.ReplayID == b.ReplayID
}

// bench is a test's own exchange (declared by the publisher) with one
// durable queue bound to it, read by an independent consumer.
type bench struct {
	url      string
	exchange string
	queue    string
	ch       *amqp.Channel
}

// setup creates a publisher on the broker at url with a fresh exchange
// (cfg.Exchange is overwritten) and a durable queue bound to it with each
// binding key, and returns both.
func setup(t *testing.T, url string, cfg outboxamqp.Config, bindings ...string) (*outboxamqp.Publisher, *bench) {
	t.Helper()
	return setupQueue(t, url, cfg, true, bindings...)
}

// setupQueue is setup with a quorum queue, or a classic durable one (which,
// unlike a quorum queue, keeps only persistent messages across a restart).
func setupQueue(t *testing.T, url string, cfg outboxamqp.Config, quorum bool, bindings ...string) (*outboxamqp.Publisher, *bench) {
	t.Helper()
	b := &bench{url: url, exchange: rabbittest.UniqueName("outboxtest-x"), queue: rabbittest.UniqueName("outboxtest-q")}
	cfg.URL, cfg.Exchange = url, b.exchange
	p, err := outboxamqp.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Probe(testCtx(t)); err != nil { // declares the exchange
		t.Fatalf("Probe: %v", err)
	}
	conn := rabbittest.Conn(t, url)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b.ch = ch
	args := amqp.Table{"x-queue-type": "classic"}
	if quorum {
		args = amqp.Table{"x-queue-type": "quorum"}
	}
	if _, err := ch.QueueDeclare(b.queue, true, false, false, false, args); err != nil {
		// quorum queues need RabbitMQ 3.8 and a node that allows them;
		// a classic durable queue gives the same guarantee on one node.
		if ch, err = conn.Channel(); err != nil {
			t.Fatal(err)
		}
		b.ch = ch
		if _, err := ch.QueueDeclare(b.queue, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range bindings {
		if err := ch.QueueBind(b.queue, key, b.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(url); err == nil {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(b.queue, false, false, false)
				_ = ch.ExchangeDelete(b.exchange, false, false)
			}
			_ = c.Close()
		}
	})
	return p, b
}

// read takes n messages off the bench's queue (acknowledging them), in
// queue order.
func (b *bench) read(t *testing.T, n int) []amqp.Delivery {
	t.Helper()
	ctx := testCtx(t)
	if err := b.ch.Qos(n, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := b.ch.ConsumeWithContext(ctx, b.queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []amqp.Delivery
	for len(got) < n {
		select {
		case d, ok := <-ds:
			if !ok {
				t.Fatalf("consumer closed after %d of %d messages", len(got), n)
			}
			got = append(got, d)
		case <-ctx.Done():
			t.Fatalf("read %d of %d messages: %v", len(got), n, ctx.Err())
		}
	}
	for _, d := range got {
		_ = d.Ack(false)
	}
	return got
}

// count is the number of messages ready in the bench's queue.
func (b *bench) count(t *testing.T) int {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(b.queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// reconnect opens the bench's consumer channel again (after a restart of
// its broker).
func (b *bench) reconnect(t *testing.T) {
	t.Helper()
	ch, err := rabbittest.Conn(t, b.url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	b.ch = ch
}
