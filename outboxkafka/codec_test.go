package outboxkafka_test

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestDecodeRefusesMalformedHeaders: a record whose ce_ attributes are
// missing, repeated or malformed is refused with an error naming the
// header, never half decoded.
func TestDecodeRefusesMalformedHeaders(t *testing.T) {
	t.Parallel()
	good := [][2]string{
		{"ce_specversion", "1.0"}, {"ce_id", "0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e"}, {"ce_type", "OrderCreated"},
		{"ce_source", "/shop"}, {"ce_subject", "o-1"}, {"ce_time", "2026-12-01T10:00:00Z"},
		{"ce_aggregatetype", "order"}, {"ce_sequence", "00000000000000000002"}, {"ce_schemaversion", "1"},
		{"content-type", "application/json"},
	}
	record := func(change func(h [][2]string) [][2]string) *kgo.Record {
		h := change(append([][2]string(nil), good...))
		r := &kgo.Record{Topic: "outbox.order", Key: []byte("o-1"), Value: []byte(`{}`)}
		for _, kv := range h {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: kv[0], Value: []byte(kv[1])})
		}
		return r
	}
	set := func(k, v string) func([][2]string) [][2]string {
		return func(h [][2]string) [][2]string {
			for i := range h {
				if h[i][0] == k {
					h[i][1] = v
					return h
				}
			}
			return append(h, [2]string{k, v})
		}
	}
	drop := func(k string) func([][2]string) [][2]string {
		return func(h [][2]string) [][2]string {
			for i := range h {
				if h[i][0] == k {
					return append(h[:i], h[i+1:]...)
				}
			}
			return h
		}
	}
	if _, err := outboxkafka.Decode(record(func(h [][2]string) [][2]string { return h })); err != nil {
		t.Fatalf("the well-formed record: %v", err)
	}
	for _, tc := range []struct {
		name, header string
		change       func([][2]string) [][2]string
	}{
		{"no specversion", "ce_specversion", drop("ce_specversion")},
		{"specversion 0.3", "ce_specversion", set("ce_specversion", "0.3")},
		{"no id", "ce_id", drop("ce_id")},
		{"id not a uuid", "ce_id", set("ce_id", "42")},
		{"id in braces", "ce_id", set("ce_id", "{0193a1f2-7c4e-7b1a-9d2e-1f2a3b4c5d6e}")},
		{"repeated id", "ce_id", func(h [][2]string) [][2]string { return append(h, [2]string{"ce_id", good[1][1]}) }},
		{"no type", "ce_type", drop("ce_type")},
		{"empty type", "ce_type", set("ce_type", "")},
		{"type not UTF-8", "ce_type", set("ce_type", "\xff")},
		{"no source", "ce_source", drop("ce_source")},
		{"no subject", "ce_subject", drop("ce_subject")},
		{"no time", "ce_time", drop("ce_time")},
		{"time not RFC 3339", "ce_time", set("ce_time", "yesterday")},
		{"no aggregate type", "ce_aggregatetype", drop("ce_aggregatetype")},
		{"no sequence", "ce_sequence", drop("ce_sequence")},
		{"sequence zero", "ce_sequence", set("ce_sequence", "0")},
		{"sequence negative", "ce_sequence", set("ce_sequence", "-2")},
		{"sequence overflow", "ce_sequence", set("ce_sequence", "99999999999999999999")},
		{"no schema version", "ce_schemaversion", drop("ce_schemaversion")},
		{"schema version +1", "ce_schemaversion", set("ce_schemaversion", "+1")},
		{"schema version over int32", "ce_schemaversion", set("ce_schemaversion", "4294967296")},
		{"skipped from at sequence", "ce_skippedfrom", set("ce_skippedfrom", "2")},
		{"skipped from text", "ce_skippedfrom", set("ce_skippedfrom", "one")},
		{"empty content type", "content-type", set("content-type", "")},
		{"replay id not a uuid", "ce_replayid", set("ce_replayid", "nope")},
		{"nil replay id", "ce_replayid", set("ce_replayid", "00000000-0000-0000-0000-000000000000")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := outboxkafka.Decode(record(tc.change))
			if err == nil {
				t.Fatalf("accepted: %+v", m)
			}
			if !strings.Contains(err.Error(), tc.header) {
				t.Fatalf("error %q does not name %s", err, tc.header)
			}
		})
	}
	if _, err := outboxkafka.Decode(nil); err == nil {
		t.Fatal("Decode(nil) succeeded")
	}
}
