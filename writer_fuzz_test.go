package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// FuzzWriter drives Event validation and the writer against the real
// PostgreSQL and NATS: every event refused is refused with ErrInvalidEvent,
// with the caller's transaction still usable and nothing written; every
// event accepted is stored, read back as the relay reads it, published, and
// decoded by a consumer byte for byte as it was written.
func FuzzWriter(f *testing.F) {
	f.Add("order", "ord-1", "OrderCreated", "", []byte(`{"total": 12.5}`), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false)
	f.Add("order", "a.b *> %", "Order Created", "application/x-protobuf", []byte{0x0a, 0, 0xff}, "x-tenant", "acme", true)
	f.Add("日本", "caf\u00e9", "é", "application/cloudevents+json", []byte(`{"a":1,"a":2}`), "k", "v", false)
	f.Add("order", "o\x00", "E", "", []byte(`{}`), "", "", false)
	f.Add("order", "o-\xff", "E", "", []byte(`{}`), "", "", true)
	f.Add("order", "o", "E", "", []byte(`{"a":"\u0000"}`), "", "", false)
	f.Add("order", "o", "E", "", []byte(`["\ud800"]`), "", "", true)
	f.Add("order", "o", "E", "", []byte(`{}`), "ce-id", "x", false)
	f.Add("order", "o", "E", "", []byte(`{}`), "x-a", "b\r\nc", false)
	f.Add("order", string(bytes.Repeat([]byte("é"), 750)), "E", "", []byte(`{}`), "", "", false)

	ctx := context.Background()
	pool, schema := outboxtest.Schema(f)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		f.Fatal(err)
	}
	nb := newNATS(f, outboxtest.NATSURL(), 0)

	f.Fuzz(func(t *testing.T, typ, id, evType, ct string, payload []byte, hk, hv string, many bool) {
		ev := outbox.Event{AggregateType: typ, AggregateID: id, Type: evType, ContentType: ct, Payload: payload}
		if hk != "" || hv != "" {
			ev.Headers = map[string]string{hk: hv}
		}
		evs := []outbox.Event{ev}
		if many { // the multi-event statement
			evs = append(evs, outbox.Event{AggregateType: "fuzz", AggregateID: "other", Type: "Pad", Payload: []byte(`{}`)})
		}
		before := countEvents(t, pool, schema)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		recs, err := w.InsertTx(ctx, tx, evs...)
		if err != nil {
			if !errors.Is(err, outbox.ErrInvalidEvent) {
				t.Fatalf("refused without ErrInvalidEvent: %v", err)
			}
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatalf("a refused event aborted the caller's transaction: %v", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if after := countEvents(t, pool, schema); after != before {
				t.Fatalf("a refused call wrote %d events", after-before)
			}
			return
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("commit an accepted event: %v", err)
		}
		msg, err := outbox.ReadMessage(ctx, pool, schema, recs[0].ID)
		if err != nil {
			t.Fatalf("read back an accepted event: %v", err)
		}
		msg.Attempt = 1
		if errs := nb.pub.Publish(ctx, []outbox.Message{msg}); errs != nil {
			t.Fatalf("publish an accepted event: %v", errs[0])
		}
		got := nb.last(t, typ, id)
		wantCT := ct
		if wantCT == "" {
			wantCT = outbox.ContentTypeJSON
		}
		if got.ID != recs[0].ID || got.AggregateType != typ || got.AggregateID != id || got.Type != evType ||
			got.ContentType != wantCT || !bytes.Equal(got.Payload, payload) || !maps.Equal(got.Headers, ev.Headers) ||
			got.Sequence != recs[0].Sequence {
			t.Fatalf("consumer got %+v\nfor event %+v (sequence %d)", got, ev, recs[0].Sequence)
		}
	})
}

// last returns the last message of an aggregate's subject, decoded.
func (b natsBundle) last(t *testing.T, typ, id string) outbox.Message {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetLastMsgForSubject(ctx, outboxnats.Subject(b.prefix, typ, id))
	if err != nil {
		t.Fatalf("read the published message back: %v", err)
	}
	m, err := outboxnats.Decode(raw.Header, raw.Data)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return m
}
