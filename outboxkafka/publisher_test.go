package outboxkafka_test

import (
	"bytes"
	"context"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

func sameMessage(a, b outbox.Message) bool {
	return a.ID == b.ID && a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.Sequence == b.Sequence && a.Type == b.Type && a.SchemaVersion == b.SchemaVersion &&
		a.ContentType == b.ContentType && bytes.Equal(a.Payload, b.Payload) && maps.Equal(a.Headers, b.Headers) &&
		a.OccurredAt.Equal(b.OccurredAt) && a.SkippedFrom == b.SkippedFrom && a.ReplayID == b.ReplayID
}

// TestRoundTrip: every field of a message crosses Publish, the broker and an
// independent consumer, and Decode returns it unchanged; the record carries
// the CloudEvents attributes as ce_ headers and the aggregate id as its key.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	c := cluster(t, 3, "rt.order", "rt.payment")
	p := publisher(t, c, outboxkafka.Config{Topic: "rt.{aggregate_type}", Source: "/shop"})

	plain := event("o-1", 1)
	plain.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme corp é"}
	plain.OccurredAt = time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	proto := event("p-1", 7)
	proto.AggregateType = "payment"
	proto.ContentType = `application/x-protobuf; messageType="shop.PaymentTaken"`
	proto.Payload = []byte{0x0a, 0x03, 'p', '-', '1', 0x00, 0xff}
	proto.SchemaVersion = 3
	proto.SkippedFrom = 4
	replay := event("o 2 \"x\" 日本", 2)
	replay.ReplayID = uuid.New()
	replay.Payload = nil
	replay.ContentType = "application/octet-stream"
	msgs := []outbox.Message{plain, proto, replay}
	checkNil(t, p.Publish(testCtx(t), msgs))

	byID := map[uuid.UUID]outbox.Message{}
	for _, m := range msgs {
		m.Attempt = 0
		byID[m.ID] = m
	}
	for _, r := range consume(t, c, len(msgs), "rt.order", "rt.payment") {
		got, err := outboxkafka.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		want, ok := byID[got.ID]
		if !ok {
			t.Fatalf("unknown event %s", got.ID)
		}
		delete(byID, got.ID)
		if len(got.Payload) == 0 {
			got.Payload = nil
		}
		if !sameMessage(got, want) {
			t.Errorf("round trip changed the message:\n got %+v\nwant %+v", got, want)
		}
		if string(r.Key) != want.AggregateID || r.Topic != "rt."+want.AggregateType {
			t.Errorf("record key %q topic %q, want %q rt.%s", r.Key, r.Topic, want.AggregateID, want.AggregateType)
		}
		h := map[string]string{}
		for _, rh := range r.Headers {
			h[rh.Key] = string(rh.Value)
		}
		for k, v := range map[string]string{"ce_specversion": "1.0", "ce_id": want.ID.String(), "ce_source": "/shop",
			"ce_type": want.Type, "ce_subject": want.AggregateID, "content-type": want.ContentType,
			"ce_sequence": outbox.SequenceHeader(want.Sequence)} {
			if h[k] != v {
				t.Errorf("header %s = %q, want %q", k, h[k], v)
			}
		}
	}
}

// TestAggregateStaysOnOnePartitionInOrder: across many publishes (one event
// per aggregate per call, as the relay sends them), each aggregate's events
// land on a single partition in sequence order.
func TestAggregateStaysOnOnePartitionInOrder(t *testing.T) {
	t.Parallel()
	c := cluster(t, 8, "ord.order")
	p := publisher(t, c, outboxkafka.Config{Topic: "ord.{aggregate_type}"})
	const aggregates, rounds = 20, 15
	ctx := testCtx(t)
	for seq := int64(1); seq <= rounds; seq++ {
		wave := make([]outbox.Message, aggregates)
		for a := range wave {
			wave[a] = event("agg-"+string(rune('a'+a)), seq)
		}
		checkNil(t, p.Publish(ctx, wave))
	}
	partition := map[string]int32{}
	last := map[string]int64{}
	for _, r := range consume(t, c, aggregates*rounds, "ord.order") {
		m, err := outboxkafka.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := partition[m.AggregateID]; ok && p != r.Partition {
			t.Fatalf("aggregate %s on partitions %d and %d", m.AggregateID, p, r.Partition)
		}
		partition[m.AggregateID] = r.Partition
		if m.Sequence != last[m.AggregateID]+1 {
			t.Fatalf("aggregate %s: sequence %d after %d", m.AggregateID, m.Sequence, last[m.AggregateID])
		}
		last[m.AggregateID] = m.Sequence
	}
	used := map[int32]bool{}
	for _, p := range partition {
		used[p] = true
	}
	if len(used) < 2 {
		t.Fatalf("%d aggregates all on one partition: the key does not spread them", aggregates)
	}
}

// TestOversizeRecordIsPermanentForItAlone: a record over MaxRecordBytes, and
// an aggregate type that cannot form a topic name, fail as permanent for
// their message only; the rest of the call is stored.
func TestOversizeRecordIsPermanentForItAlone(t *testing.T) {
	t.Parallel()
	c := cluster(t, 1, "big.order")
	p := publisher(t, c, outboxkafka.Config{Topic: "big.{aggregate_type}", MaxRecordBytes: 4096})
	big := event("o-2", 1)
	big.Payload = bytes.Repeat([]byte("x"), 5000)
	badTopic := event("o-4", 1)
	badTopic.AggregateType = "order/eu"
	longTopic := event("o-5", 1)
	longTopic.AggregateType = strings.Repeat("o", 250)
	msgs := []outbox.Message{event("o-1", 1), big, event("o-3", 1), badTopic, longTopic}
	errs := p.Publish(testCtx(t), msgs)
	if len(errs) != len(msgs) || errs[0] != nil || errs[2] != nil {
		t.Fatalf("Publish errors %v: want only the oversize and bad-topic ones to fail", errs)
	}
	for _, i := range []int{1, 3, 4} {
		if !outbox.IsPermanent(errs[i]) || outbox.IsUnavailable(errs[i]) {
			t.Errorf("message %d: %v, want a permanent error", i, errs[i])
		}
	}
	if n := len(consume(t, c, 2, "big.order")); n != 2 {
		t.Fatalf("%d records stored, want 2", n)
	}
}

// TestUnreachableClusterIsUnavailable: with no broker answering (a closed
// cluster, a port nobody listens on) every message fails as unavailable,
// and Probe says so too; Probe is nil while the cluster is up.
func TestUnreachableClusterIsUnavailable(t *testing.T) {
	t.Parallel()
	c := cluster(t, 1, "down.order")
	p := publisher(t, c, outboxkafka.Config{Topic: "down.{aggregate_type}", DeliveryTimeout: time.Second, DialTimeout: time.Second})
	ctx := testCtx(t)
	if err := p.Probe(ctx); err != nil {
		t.Fatalf("Probe while up: %v", err)
	}
	checkNil(t, p.Publish(ctx, []outbox.Message{event("o-0", 1)}))
	c.Close()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	never, err := outboxkafka.NewPublisher(outboxkafka.Config{Brokers: []string{free}, Topic: "down.{aggregate_type}",
		DeliveryTimeout: time.Second, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(never.Close)

	for name, p := range map[string]*outboxkafka.Publisher{"closed cluster": p, "free port": never} {
		msgs := []outbox.Message{event("o-1", 2), event("o-2", 1), event("o-3", 1)}
		errs := p.Publish(ctx, msgs)
		if len(errs) != len(msgs) {
			t.Fatalf("%s: Publish errors %v, want one per message", name, errs)
		}
		for i, err := range errs {
			if !outbox.IsUnavailable(err) {
				t.Errorf("%s: message %d: %v, want unavailable", name, i, err)
			}
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.Probe(pctx)
		cancel()
		if !outbox.IsUnavailable(err) {
			t.Errorf("%s: Probe: %v, want unavailable", name, err)
		}
	}
}

// TestNewPublisherRefusesBadConfig: no brokers, or a topic template that
// cannot make a valid topic name, is refused up front.
func TestNewPublisherRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outboxkafka.Config{
		{},
		{Brokers: []string{"127.0.0.1:1"}, Topic: "bad topic.{aggregate_type}"},
		{Brokers: []string{"127.0.0.1:1"}, Topic: strings.Repeat("t", 250)},
	} {
		if p, err := outboxkafka.NewPublisher(cfg); err == nil {
			p.Close()
			t.Errorf("NewPublisher(%+v) succeeded, want an error", cfg)
		}
	}
}
