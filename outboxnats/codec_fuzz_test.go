package outboxnats

import (
	"bytes"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/pgoutbox/outbox"
)

// wire encodes a header block the way nats.go sends it and parses it back the
// way a subscriber's client does: what a consumer really receives.
func wire(t *testing.T, h nats.Header) nats.Header {
	t.Helper()
	var b strings.Builder
	b.WriteString("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	got, err := nats.DecodeHeadersMsg([]byte(b.String()))
	if err != nil {
		t.Fatalf("parse our own header block: %v", err)
	}
	return got
}

func sameMessage(a, b outbox.Message) bool {
	return a.ID == b.ID && a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.Sequence == b.Sequence && a.Type == b.Type && a.SchemaVersion == b.SchemaVersion &&
		a.ContentType == b.ContentType && bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.Headers, b.Headers) &&
		a.OccurredAt.Equal(b.OccurredAt) && a.SkippedFrom == b.SkippedFrom && a.ReplayID == b.ReplayID
}

// FuzzEncodeDecode: every event the writer accepts (outbox.Event.Validate)
// crosses a NATS header block and comes back from Decode unchanged, whatever
// its text: ids and types with dots, spaces, '%', non-ASCII, header values
// with any printable text.
func FuzzEncodeDecode(f *testing.F) {
	f.Add("order", "ord-1", "OrderCreated", "", []byte(`{"a":1}`), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", int64(1), int64(0), 1)
	f.Add("order type", "a.b *>", "Order Created", "application/x-protobuf", []byte{0, 1, 0xff}, "x-tenant", "acme corp", int64(7), int64(3), 2)
	f.Add("日本", "50% \"off\"", "é", "application/cloudevents+json; charset=utf-8", []byte(`[1, 2 ,3]`), "k", "v%20v", int64(2), int64(1), 9)
	f.Add("t", "\x7f", "e", "text/plain", []byte{}, "", "", int64(1), int64(0), 0)
	f.Fuzz(func(t *testing.T, typ, id, evType, ct string, payload []byte, hk, hv string, seq, skipped int64, version int) {
		ev := outbox.Event{AggregateType: typ, AggregateID: id, Type: evType, ContentType: ct, Payload: payload, SchemaVersion: version}
		if hk != "" {
			ev.Headers = map[string]string{hk: hv}
		}
		if ev.Validate() != nil || seq < 1 || skipped < 0 || skipped >= seq {
			return // refused by the writer; never published
		}
		if version == 0 {
			version = 1
		}
		if ct == "" {
			ct = outbox.ContentTypeJSON
		}
		msg := outbox.Message{ID: uuid.New(), AggregateType: typ, AggregateID: id, Sequence: seq, Type: evType,
			SchemaVersion: version, ContentType: ct, Payload: payload, Headers: ev.Headers, SkippedFrom: skipped,
			OccurredAt: time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)}
		if len(msg.Payload) == 0 {
			msg.Payload = nil
		}
		m, err := encode(&msg, "events", "urn:test")
		if err != nil {
			t.Fatalf("encode an accepted event: %v", err)
		}
		got, err := Decode(wire(t, m.Header), m.Data)
		if err != nil {
			t.Fatalf("Decode our own message: %v", err)
		}
		if len(got.Payload) == 0 {
			got.Payload = nil
		}
		if !sameMessage(got, msg) {
			t.Fatalf("round trip changed the message:\n got %+v\nwant %+v", got, msg)
		}
		gotType, gotID, err := ParseSubject("events", m.Subject)
		if err != nil || gotType != typ || gotID != id {
			t.Fatalf("subject %q parsed as %q, %q, %v", m.Subject, gotType, gotID, err)
		}
	})
}

// FuzzDecode: Decode never panics on any header block a subscriber can
// receive, and whatever it accepts encodes back to the same message.
func FuzzDecode(f *testing.F) {
	good := "NATS/1.0\r\nce-specversion: 1.0\r\nce-id: 0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e\r\nce-type: OrderCreated\r\n" +
		"ce-source: urn:x\r\nce-subject: ord-1\r\nce-time: 2026-12-01T10:00:00.5Z\r\nce-aggregatetype: order\r\n" +
		"ce-sequence: 00000000000000000002\r\nce-schemaversion: 1\r\ncontent-type: application/json\r\n"
	f.Add(good+"\r\n", []byte(`{}`))
	f.Add(good+"ce-skippedfrom: 1\r\ntraceparent: 00-x\r\n\r\n", []byte(`{}`))
	f.Add(strings.Replace(good, "00000000000000000002", "-2", 1)+"\r\n", []byte(`{}`))
	f.Add(strings.Replace(good, "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e", "{0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e}", 1)+"\r\n", []byte(nil))
	f.Add(strings.Replace(good, "ord-1", "ord%2", 1)+"\r\n", []byte(nil))
	f.Add(good+"ce-skippedfrom: 2\r\n\r\n", []byte(nil))
	f.Add(good+"ce-replayid: nope\r\n\r\n", []byte(nil))
	f.Fuzz(func(t *testing.T, block string, data []byte) {
		h, err := nats.DecodeHeadersMsg([]byte(block))
		if err != nil {
			return
		}
		m, err := Decode(h, data)
		if err != nil {
			return
		}
		if m.ID == uuid.Nil && !strings.Contains(block, "00000000-0000-0000-0000-000000000000") {
			t.Fatalf("accepted a message without an id: %+v", m)
		}
		if m.Sequence < 1 || m.SchemaVersion < 1 || m.SkippedFrom < 0 || (m.SkippedFrom > 0 && m.SkippedFrom >= m.Sequence) {
			t.Fatalf("accepted out-of-range numbers: %+v", m)
		}
		enc, err := encode(&m, "events", "urn:x")
		if err != nil {
			return // e.g. a header name no publisher would send
		}
		again, err := Decode(wire(t, enc.Header), enc.Data)
		if err != nil {
			t.Fatalf("Decode of the re-encoded message: %v", err)
		}
		if !sameMessage(again, m) {
			t.Fatalf("re-encoding changed the message:\n got %+v\nwant %+v", again, m)
		}
	})
}
