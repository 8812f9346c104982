package outbox_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestPayloadPublishedExactlyAsWritten is the regression test of issue 8,
// item 3: payloads were stored as jsonb, so the broker received another
// document (keys sorted, whitespace changed, duplicate keys dropped; 600,003
// bytes in became 900,003 out). Now the bytes written are the bytes
// published, on both statements and both drivers, JSON or not, with the
// content type carried along; and a jsonb row written by hand (another
// language, or before migration 003) is still published.
func TestPayloadPublishedExactlyAsWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)

	big := []byte(`{"items":[` + strings.Repeat(`{"sku": "a" , "n":1},`, 30000) + `{}]}`)
	cases := []outbox.Event{
		{Type: "Spaced", Payload: []byte("{ \"z\" : 1,\n  \"a\" : [ 1 , 2 ] }")},
		{Type: "DuplicateKeys", Payload: []byte(`{"a":1,"a":2}`)},
		{Type: "Escapes", Payload: []byte(`{"s":"\u00e9\ud83d\ude00 \"q\" \\u0000"}`)},
		{Type: "Numbers", Payload: []byte(`[1.0, 1e2, 12345678901234567890]`)},
		{Type: "Big", Payload: big},
		{Type: "Protobuf", ContentType: "application/x-protobuf", Payload: []byte{0x0a, 0x00, 0xff, 0x00}},
		{Type: "Empty", ContentType: "application/octet-stream", Payload: []byte{}},
		{Type: "CloudEventJSON", ContentType: "application/cloudevents+json; charset=utf-8", Payload: []byte(`{"x" :1}`)},
	}
	var want []outbox.Event
	for i, ev := range cases {
		// Each case through both statements and both drivers.
		for j, path := range []string{"pgx-one", "pgx-many", "sql-one", "sql-many"} {
			ev := ev
			ev.AggregateType, ev.AggregateID = "doc", path+"-"+ev.Type
			evs := []outbox.Event{ev}
			if strings.HasSuffix(path, "many") {
				evs = append(evs, outbox.Event{AggregateType: "doc", AggregateID: path + "-second", Type: "Pad", Payload: []byte(`{}`)})
			}
			var err error
			if j < 2 {
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, evs...); return err })
			} else {
				err = func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					if _, err := w.InsertSQLTx(ctx, tx, evs...); err != nil {
						_ = tx.Rollback()
						return err
					}
					return tx.Commit()
				}()
			}
			if err != nil {
				t.Fatalf("case %d via %s: %v", i, path, err)
			}
			want = append(want, evs...)
		}
	}
	// A row inserted by hand with a jsonb payload, as a writer in another
	// language may do: published as its jsonb text.
	if _, err := pool.Exec(ctx, `
INSERT INTO `+schema+`.outbox_aggregates VALUES ('doc', 'by-hand', 1);
INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
VALUES (gen_random_uuid(), 'doc', 'by-hand', 1, 'Legacy', '{"b": 1, "a": 2}');`); err != nil {
		t.Fatal(err)
	}
	want = append(want, outbox.Event{AggregateType: "doc", AggregateID: "by-hand", Type: "Legacy", Payload: []byte(`{"a": 2, "b": 1}`)})

	startRelay(t, pool, quietConfig(schema, b.pub))
	outboxtest.Eventually(t, 30*time.Second, "everything published", func() bool { return unpublished(t, pool, schema) == 0 })
	got := map[string]outbox.Message{}
	for _, m := range b.streamEvents(t) {
		got[m.AggregateID] = m
	}
	for _, ev := range want {
		m, ok := got[ev.AggregateID]
		if !ok {
			t.Fatalf("%s: not at the broker", ev.AggregateID)
		}
		ct := ev.ContentType
		if ct == "" {
			ct = outbox.ContentTypeJSON
		}
		if !bytes.Equal(m.Payload, ev.Payload) || m.ContentType != ct {
			t.Errorf("%s: published %d bytes (%.60q) as %q, want %d bytes (%.60q) as %q",
				ev.AggregateID, len(m.Payload), m.Payload, m.ContentType, len(ev.Payload), ev.Payload, ct)
		}
	}
}

// TestPayloadLimitBoundsWhatIsSent: MaxPayloadBytes is checked on the bytes
// that will be published, so an event accepted at the limit is published,
// never refused later as too large.
func TestPayloadLimitBoundsWhatIsSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, MaxPayloadBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	b := newNATS(t, outboxtest.NATSURL(), 0)
	// 1,000 bytes as written; jsonb would have added a space after every
	// comma (1,495 bytes).
	atLimit := []byte(`{"k": [1` + strings.Repeat(`,1`, 495) + `]}`)
	if len(atLimit) != 1000 {
		t.Fatalf("test payload is %d bytes", len(atLimit))
	}
	over := append([]byte(`[`+strings.Repeat(" ", 999)), ']')
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "doc", AggregateID: "over", Type: "T", Payload: over}); err == nil {
			t.Error("a 1,001-byte payload was accepted under a 1,000-byte limit")
		}
		_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "doc", AggregateID: "limit", Type: "T", Payload: atLimit})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	startRelay(t, pool, quietConfig(schema, b.pub))
	outboxtest.Eventually(t, 30*time.Second, "published", func() bool { return unpublished(t, pool, schema) == 0 })
	msgs := b.streamEvents(t)
	if len(msgs) != 1 || len(msgs[0].Payload) != 1000 {
		t.Fatalf("broker got %d messages, payload %d bytes; want one of 1,000", len(msgs), len(msgs[0].Payload))
	}
}
