package outboxkafka

import (
	"bytes"
	"maps"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
)

func sameMessage(a, b outbox.Message) bool {
	return a.ID == b.ID && a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.Sequence == b.Sequence && a.Type == b.Type && a.SchemaVersion == b.SchemaVersion &&
		a.ContentType == b.ContentType && bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.Headers, b.Headers) &&
		a.OccurredAt.Equal(b.OccurredAt) && a.SkippedFrom == b.SkippedFrom && a.ReplayID == b.ReplayID
}

// headers parses "key: value" lines (a test notation; Kafka headers are
// binary key/value pairs) into record headers.
func headers(block string) []kgo.RecordHeader {
	var h []kgo.RecordHeader
	for _, line := range strings.Split(block, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if ok {
			h = append(h, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	return h
}

// FuzzDecode: Decode never panics on any set of headers a consumer can
// receive, accepts only numbers in range, and whatever it accepts encodes
// back to the same message.
func FuzzDecode(f *testing.F) {
	good := "ce_specversion: 1.0\nce_id: 0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e\nce_type: OrderCreated\n" +
		"ce_source: urn:x\nce_subject: ord-1\nce_time: 2026-12-01T10:00:00.5Z\nce_aggregatetype: order\n" +
		"ce_sequence: 00000000000000000002\nce_schemaversion: 1\ncontent-type: application/json\n"
	f.Add(good, []byte(`{}`))
	f.Add(good+"ce_skippedfrom: 1\ntraceparent: 00-x\n", []byte(`{}`))
	f.Add(strings.Replace(good, "00000000000000000002", "-2", 1), []byte(`{}`))
	f.Add(strings.Replace(good, "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e", "{0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e}", 1), []byte(nil))
	f.Add(good+"ce_skippedfrom: 2\n", []byte(nil))
	f.Add(good+"ce_replayid: nope\n", []byte(nil))
	f.Add(good+"ce_id: 0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6f\n", []byte(nil))
	f.Add(strings.Replace(good, "ce_time: 2026-12-01T10:00:00.5Z", "ce_time: yesterday", 1), []byte{0xff})
	f.Fuzz(func(t *testing.T, block string, value []byte) {
		m, err := Decode(&kgo.Record{Topic: "t", Key: []byte("k"), Value: value, Headers: headers(block)})
		if err != nil {
			return
		}
		if m.Sequence < 1 || m.SchemaVersion < 1 || m.SkippedFrom < 0 || (m.SkippedFrom > 0 && m.SkippedFrom >= m.Sequence) {
			t.Fatalf("accepted out-of-range numbers: %+v", m)
		}
		r, err := encode(&m, "t", "urn:x")
		if err != nil {
			t.Fatalf("encode a decoded message: %v", err)
		}
		again, err := Decode(r)
		if err != nil {
			t.Fatalf("Decode of the re-encoded message: %v", err)
		}
		if !sameMessage(again, m) {
			t.Fatalf("re-encoding changed the message:\n got %+v\nwant %+v", again, m)
		}
		if string(r.Key) != m.AggregateID {
			t.Fatalf("key %q, aggregate id %q", r.Key, m.AggregateID)
		}
	})
}

// TestEncodeKeepsReservedHeaders: a message's own header never overrides a
// ce_ attribute or content-type, whatever its case.
func TestEncodeKeepsReservedHeaders(t *testing.T) {
	m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o-1", Sequence: 1, Type: "T",
		SchemaVersion: 1, ContentType: "text/plain", Headers: map[string]string{"ce_id": "x", "CE_TYPE": "y", "Content-Type": "z", "k": "v"}}
	r, err := encode(&m, "t", "urn:x")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != m.ID || got.Type != "T" || got.ContentType != "text/plain" || len(got.Headers) != 1 || got.Headers["k"] != "v" {
		t.Fatalf("decoded %+v", got)
	}
}
