package outboxamqp_test

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestDecodeRefusesMalformedProperties: a delivery whose cloudEvents:
// attributes are missing, not strings or malformed is refused with an error
// naming the property, never half decoded.
func TestDecodeRefusesMalformedProperties(t *testing.T) {
	t.Parallel()
	good := func() amqp.Table {
		return amqp.Table{
			"cloudEvents:specversion": "1.0", "cloudEvents:id": "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e", "cloudEvents:type": "OrderCreated",
			"cloudEvents:source": "/shop", "cloudEvents:subject": "o-1", "cloudEvents:time": "2026-12-01T10:00:00Z",
			"cloudEvents:aggregatetype": "order", "cloudEvents:sequence": "00000000000000000002", "cloudEvents:schemaversion": "1",
		}
	}
	d := func(change func(amqp.Table)) amqp.Delivery {
		h := good()
		change(h)
		return amqp.Delivery{Headers: h, ContentType: "application/json", Body: []byte(`{}`)}
	}
	set := func(k string, v any) func(amqp.Table) { return func(h amqp.Table) { h[k] = v } }
	drop := func(k string) func(amqp.Table) { return func(h amqp.Table) { delete(h, k) } }
	m, err := outboxamqp.Decode(d(func(amqp.Table) {}))
	if err != nil {
		t.Fatalf("the well-formed delivery: %v", err)
	}
	if m.Sequence != 2 || m.AggregateID != "o-1" || m.Headers != nil {
		t.Fatalf("decoded %+v", m)
	}
	for _, tc := range []struct {
		name, prop string
		change     func(amqp.Table)
	}{
		{"no specversion", "cloudEvents:specversion", drop("cloudEvents:specversion")},
		{"specversion 0.3", "cloudEvents:specversion", set("cloudEvents:specversion", "0.3")},
		{"no id", "cloudEvents:id", drop("cloudEvents:id")},
		{"id not a uuid", "cloudEvents:id", set("cloudEvents:id", "42")},
		{"id an integer", "cloudEvents:id", set("cloudEvents:id", int64(42))},
		{"id in braces", "cloudEvents:id", set("cloudEvents:id", "{0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e}")},
		{"no type", "cloudEvents:type", drop("cloudEvents:type")},
		{"empty type", "cloudEvents:type", set("cloudEvents:type", "")},
		{"type not UTF-8", "cloudEvents:type", set("cloudEvents:type", "\xff")},
		{"no source", "cloudEvents:source", drop("cloudEvents:source")},
		{"no subject", "cloudEvents:subject", drop("cloudEvents:subject")},
		{"no time", "cloudEvents:time", drop("cloudEvents:time")},
		{"time not RFC 3339", "cloudEvents:time", set("cloudEvents:time", "yesterday")},
		{"no aggregate type", "cloudEvents:aggregatetype", drop("cloudEvents:aggregatetype")},
		{"no sequence", "cloudEvents:sequence", drop("cloudEvents:sequence")},
		{"sequence zero", "cloudEvents:sequence", set("cloudEvents:sequence", "0")},
		{"sequence an integer", "cloudEvents:sequence", set("cloudEvents:sequence", int32(2))},
		{"sequence negative", "cloudEvents:sequence", set("cloudEvents:sequence", "-2")},
		{"sequence overflow", "cloudEvents:sequence", set("cloudEvents:sequence", "99999999999999999999")},
		{"no schema version", "cloudEvents:schemaversion", drop("cloudEvents:schemaversion")},
		{"schema version +1", "cloudEvents:schemaversion", set("cloudEvents:schemaversion", "+1")},
		{"schema version over int32", "cloudEvents:schemaversion", set("cloudEvents:schemaversion", "4294967296")},
		{"skipped from at sequence", "cloudEvents:skippedfrom", set("cloudEvents:skippedfrom", "2")},
		{"skipped from text", "cloudEvents:skippedfrom", set("cloudEvents:skippedfrom", "one")},
		{"replay id not a uuid", "cloudEvents:replayid", set("cloudEvents:replayid", "nope")},
		{"nil replay id", "cloudEvents:replayid", set("cloudEvents:replayid", "00000000-0000-0000-0000-000000000000")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := outboxamqp.Decode(d(tc.change))
			if err == nil {
				t.Fatalf("accepted: %+v", m)
			}
			if !strings.Contains(err.Error(), tc.prop) {
				t.Fatalf("error %q does not name %s", err, tc.prop)
			}
		})
	}
	if _, err := outboxamqp.Decode(amqp.Delivery{}); err == nil {
		t.Fatal("Decode of an empty delivery succeeded")
	}
}

// TestDecodeSkipsBrokerProperties: properties that are not strings, such as
// the x-death table of a dead-lettered message, do not stop a consumer of a
// dead-letter queue from decoding it; string properties are headers.
func TestDecodeSkipsBrokerProperties(t *testing.T) {
	t.Parallel()
	h := amqp.Table{
		"cloudEvents:specversion": "1.0", "cloudEvents:id": "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e", "cloudEvents:type": "OrderCreated",
		"cloudEvents:source": "/shop", "cloudEvents:subject": "o-1", "cloudEvents:time": "2026-12-01T10:00:00Z",
		"cloudEvents:aggregatetype": "order", "cloudEvents:sequence": "00000000000000000002", "cloudEvents:schemaversion": "1",
		"x-death": []any{amqp.Table{"count": int64(1), "queue": "q"}}, "x-first-death-queue": "q", "cloudEvents:other": int64(3),
	}
	m, err := outboxamqp.Decode(amqp.Delivery{Headers: h})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Headers) != 1 || m.Headers["x-first-death-queue"] != "q" || m.ContentType != outboxamqp.ContentType {
		t.Fatalf("decoded %+v", m)
	}
}
