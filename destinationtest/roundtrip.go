package destinationtest

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// roundTrip publishes messages that use every field of outbox.Message and
// reads them back: each must decode to what was published, with the
// CloudEvents attributes and the dedup key in the protocol's binding.
func roundTrip(t *testing.T, d Destination) {
	tg := open(t, d.Open)
	ctx := testCtx(t, time.Minute)

	plain := message("o-1", 1)
	plain.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme corp é"}
	binary := message("p-1", 7)
	binary.AggregateType = AggregateTypes[1]
	binary.Type = "PaymentTaken"
	binary.ContentType = `application/x-protobuf; messageType="shop.PaymentTaken"`
	binary.Payload = []byte{0x0a, 0x03, 'p', '-', '1', 0x00, 0xff}
	binary.SchemaVersion = 3
	binary.SkippedFrom = 4
	empty := message(`o 2 "x" 日本`, 2)
	empty.ContentType = "application/octet-stream"
	empty.Payload = nil
	large := message("o-3", 1)
	large.Payload = append(append([]byte(`{"blob":"`), bytes.Repeat([]byte("x"), 200<<10)...), `"}`...)
	msgs := []outbox.Message{plain, binary, empty, large}
	publishAll(t, ctx, tg.Publisher, msgs)

	want := map[uuid.UUID]outbox.Message{}
	for _, m := range msgs {
		want[m.ID] = m
	}
	for _, dv := range read(t, ctx, tg, len(msgs)) {
		m, ok := want[dv.Message.ID]
		if !ok {
			t.Errorf("read back a message that was not published: %s", dv.Message.ID)
			continue
		}
		delete(want, m.ID)
		if diff := differences(dv.Message, m); diff != "" {
			t.Errorf("message %s/%d came back changed:%s", m.AggregateID, m.Sequence, diff)
		}
		checkAttributes(t, d, dv, m)
	}
	for id := range want {
		t.Errorf("message %s was reported published but is not at the destination", id)
	}
}

// checkAttributes checks the CloudEvents attributes every binding carries
// and the dedup key.
func checkAttributes(t *testing.T, d Destination, dv Delivery, m outbox.Message) {
	t.Helper()
	p := d.AttributePrefix
	for name, want := range map[string]string{"specversion": "1.0", "id": m.ID.String(), "type": m.Type} {
		if got, ok := dv.Attributes[p+name]; !ok || got != want {
			t.Errorf("message %s: attribute %s%s = %q (present %v), want %q", m.ID, p, name, got, ok, want)
		}
	}
	if dv.Attributes[p+"source"] == "" {
		t.Errorf("message %s: no %ssource attribute", m.ID, p)
	}
	if d.DedupKey && m.ReplayID == uuid.Nil && dv.Key != m.ID.String() {
		t.Errorf("message %s: dedup key %q, want the event id", m.ID, dv.Key)
	}
}

// replay publishes a message, then a replayed copy of it (same id, a replay
// id): both must reach the destination, even one that drops duplicates by
// key.
func replay(t *testing.T, d Destination) {
	tg := open(t, d.Open)
	ctx := testCtx(t, time.Minute)
	orig := message("o-r", 1)
	publishAll(t, ctx, tg.Publisher, []outbox.Message{orig})
	again := orig
	again.ReplayID = uuid.New()
	again.Attempt = 1
	publishAll(t, ctx, tg.Publisher, []outbox.Message{again})

	ds := read(t, ctx, tg, 2)
	var sawOrig, sawReplay bool
	for _, dv := range ds {
		switch dv.Message.ReplayID {
		case uuid.Nil:
			sawOrig = true
			if diff := differences(dv.Message, orig); diff != "" {
				t.Errorf("original came back changed:%s", diff)
			}
		case again.ReplayID:
			sawReplay = true
			if diff := differences(dv.Message, again); diff != "" {
				t.Errorf("replayed copy came back changed:%s", diff)
			}
			checkAttributes(t, d, dv, again)
		default:
			t.Errorf("unexpected message %s with replay id %s", dv.Message.ID, dv.Message.ReplayID)
		}
	}
	if !sawOrig || !sawReplay {
		t.Fatalf("read back %d messages: original there %v, replayed copy there %v; want both", len(ds), sawOrig, sawReplay)
	}
}
