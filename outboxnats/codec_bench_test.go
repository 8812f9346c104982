package outboxnats

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/pgoutbox/outbox"
)

func benchMessage() outbox.Message {
	return outbox.Message{
		ID: uuid.New(), AggregateType: "order", AggregateID: "0192f1c2-7d2e-7b7a-9c1d-3f4e5a6b7c8d", Sequence: 42,
		Type: "OrderCreated", SchemaVersion: 1, OccurredAt: time.Now(),
		Payload: []byte(`{"order_id":"0192f1c2-7d2e-7b7a-9c1d-3f4e5a6b7c8d","customer_id":"customer-42","items":[{"sku":"sku-1","quantity":2}],"total_cents":12345}`),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

// BenchmarkEncode measures building one message's subject and CloudEvents
// headers: the publisher's per-event CPU cost, without the network.
func BenchmarkEncode(b *testing.B) {
	p := &Publisher{cfg: Config{}.withDefaults(), nc: &nats.Conn{}}
	m := benchMessage()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.natsMsg(&m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode measures a consumer's Decode of one message.
func BenchmarkDecode(b *testing.B) {
	p := &Publisher{cfg: Config{}.withDefaults(), nc: &nats.Conn{}}
	m := benchMessage()
	nm, err := p.natsMsg(&m)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(nm.Header, nm.Data); err != nil {
			b.Fatal(err)
		}
	}
}
