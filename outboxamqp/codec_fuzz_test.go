package outboxamqp

import (
	"bytes"
	"maps"
	"strings"
	"testing"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
)

func sameMessage(a, b outbox.Message) bool {
	return a.ID == b.ID && a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.Sequence == b.Sequence && a.Type == b.Type && a.SchemaVersion == b.SchemaVersion &&
		a.ContentType == b.ContentType && bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.Headers, b.Headers) &&
		a.OccurredAt.Equal(b.OccurredAt) && a.SkippedFrom == b.SkippedFrom && a.ReplayID == b.ReplayID
}

// table parses "key: value" lines (a test notation) into application
// properties; a value "#n" becomes the integer n, to try non-string values.
func table(block string) amqp.Table {
	h := amqp.Table{}
	for _, line := range strings.Split(block, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if strings.HasPrefix(v, "#") {
			h[k] = int64(len(v))
			continue
		}
		h[k] = v
	}
	return h
}

// delivery is what a consumer receives for p.
func delivery(p amqp.Publishing) amqp.Delivery {
	return amqp.Delivery{Headers: p.Headers, ContentType: p.ContentType, MessageId: p.MessageId, DeliveryMode: p.DeliveryMode,
		Type: p.Type, Timestamp: p.Timestamp, Body: p.Body}
}

// FuzzDecode: Decode never panics on any set of application properties a
// consumer can receive, accepts only numbers in range, and whatever it
// accepts encodes back to the same message.
func FuzzDecode(f *testing.F) {
	good := "cloudEvents:specversion: 1.0\ncloudEvents:id: 0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e\ncloudEvents:type: OrderCreated\n" +
		"cloudEvents:source: urn:x\ncloudEvents:subject: ord-1\ncloudEvents:time: 2026-12-01T10:00:00.5Z\ncloudEvents:aggregatetype: order\n" +
		"cloudEvents:sequence: 00000000000000000002\ncloudEvents:schemaversion: 1\n"
	f.Add(good, "application/json", []byte(`{}`))
	f.Add(good+"cloudEvents:skippedfrom: 1\ntraceparent: 00-x\n", "", []byte(`{}`))
	f.Add(strings.Replace(good, "00000000000000000002", "-2", 1), "text/plain", []byte(`{}`))
	f.Add(strings.Replace(good, "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e", "{0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e}", 1), "", []byte(nil))
	f.Add(good+"cloudEvents:skippedfrom: 2\n", "", []byte(nil))
	f.Add(good+"cloudEvents:replayid: nope\n", "", []byte(nil))
	f.Add(good+"cloudEvents:sequence: #1\n", "", []byte(nil))
	f.Add(good+"x-count: #12\nCC: a\ncloudEvents_id: x\n", "", []byte(nil))
	f.Add(strings.Replace(good, "cloudEvents:time: 2026-12-01T10:00:00.5Z", "cloudEvents:time: yesterday", 1), "", []byte{0xff})
	f.Fuzz(func(t *testing.T, block, contentType string, body []byte) {
		m, err := Decode(amqp.Delivery{Headers: table(block), ContentType: contentType, Body: body})
		if err != nil {
			return
		}
		if m.Sequence < 1 || m.SchemaVersion < 1 || m.SkippedFrom < 0 || (m.SkippedFrom > 0 && m.SkippedFrom >= m.Sequence) {
			t.Fatalf("accepted out-of-range numbers: %+v", m)
		}
		if m.ContentType == "" {
			t.Fatalf("empty content type: %+v", m)
		}
		p, _, err := encode(&m, "t.{aggregate_type}", "urn:x")
		if err != nil {
			if outbox.IsPermanent(err) && len("t.")+len(m.AggregateType) > maxShortString {
				return // a routing key too long for AMQP: refused before sending
			}
			t.Fatalf("encode a decoded message: %v", err)
		}
		if err := p.Headers.Validate(); err != nil {
			t.Fatalf("encoded properties amqp091 refuses: %v", err)
		}
		again, err := Decode(delivery(p))
		if err != nil {
			t.Fatalf("Decode of the re-encoded message: %v", err)
		}
		if !sameMessage(again, m) {
			t.Fatalf("re-encoding changed the message:\n got %+v\nwant %+v", again, m)
		}
		if p.MessageId != m.ID.String() || p.DeliveryMode != amqp.Persistent {
			t.Fatalf("message-id %q delivery mode %d", p.MessageId, p.DeliveryMode)
		}
	})
}

// TestEncodeKeepsReservedHeaders: a message's own header never sets a
// CloudEvents attribute (either prefix, any case) or RabbitMQ's CC and BCC
// routing headers.
func TestEncodeKeepsReservedHeaders(t *testing.T) {
	m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o-1", Sequence: 1, Type: "T",
		SchemaVersion: 1, ContentType: "text/plain", Headers: map[string]string{"cloudEvents:id": "x", "CLOUDEVENTS:type": "y",
			"cloudEvents_type": "z", "CC": "outbox.other", "BCC": "outbox.other", "k": "v"}}
	p, _, err := encode(&m, "outbox.{aggregate_type}", "urn:x")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(delivery(p))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != m.ID || got.Type != "T" || got.ContentType != "text/plain" || len(got.Headers) != 1 || got.Headers["k"] != "v" {
		t.Fatalf("decoded %+v", got)
	}
	if _, ok := p.Headers["CC"]; ok {
		t.Fatal("CC header sent")
	}
}
