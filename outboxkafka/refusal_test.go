package outboxkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// limitedTopic starts a cluster with topic, of one partition, whose
// max.message.bytes is limit.
func limitedTopic(t *testing.T, topic, limit string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": &limit}, topic); err != nil {
		t.Fatal(err)
	}
	return c
}

// noise is n bytes of JSON that do not compress.
func noise(t *testing.T, n int) []byte {
	b := make([]byte, n/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return []byte(`"` + hex.EncodeToString(b)[:n-2] + `"`)
}

// TestBrokerRefusalFailsOnlyItsRecord (issue 19, item 5): in one call, three
// aggregates' runs share the one partition of a topic whose
// max.message.bytes is below one record of run "b" (which MaxRecordBytes
// allows). The broker refuses the record batch, and the client fails every
// record of the partition with MESSAGE_TOO_LARGE; the publisher produces
// them again alone and only the refused record fails, as permanent. The
// ordered-pipelining promise holds: per aggregate, successes followed only
// by failures, and nothing after a failed record is stored.
func TestBrokerRefusalFailsOnlyItsRecord(t *testing.T) {
	t.Parallel()
	c := limitedTopic(t, "lim.order", "8000")
	p := publisher(t, c, outboxkafka.Config{Topic: "lim.{aggregate_type}", MaxRecordBytes: 64 << 10})
	var msgs []outbox.Message
	for _, agg := range []string{"a", "b", "c"} {
		for seq := int64(1); seq <= 4; seq++ {
			msgs = append(msgs, event(agg, seq))
		}
	}
	msgs[5].Payload = noise(t, 9000) // b #2
	errs := p.Publish(testCtx(t), msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish errors %v, want b #2 and the rest of b to fail", errs)
	}
	for i, err := range errs {
		m := msgs[i]
		switch {
		case m.AggregateID == "b" && m.Sequence == 2:
			if !outbox.IsPermanent(err) || outbox.IsUnavailable(err) {
				t.Errorf("b #2: %v, want a permanent error", err)
			}
		case m.AggregateID == "b" && m.Sequence > 2:
			if err == nil || outbox.IsPermanent(err) {
				t.Errorf("b #%d: %v, want a plain error (not produced after b #2 failed)", m.Sequence, err)
			}
		default:
			if err != nil {
				t.Errorf("%s #%d: %v, want success", m.AggregateID, m.Sequence, err)
			}
		}
	}
	last := map[string]int64{}
	for _, r := range consume(t, c, 9, "lim.order") {
		m, err := outboxkafka.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if m.Sequence != last[m.AggregateID]+1 {
			t.Fatalf("%s #%d stored after #%d", m.AggregateID, m.Sequence, last[m.AggregateID])
		}
		last[m.AggregateID] = m.Sequence
	}
	if last["a"] != 4 || last["b"] != 1 || last["c"] != 4 {
		t.Fatalf("stored a through %d, b through %d, c through %d; want 4, 1, 4", last["a"], last["b"], last["c"])
	}
}

// TestBatchTooLargeBlamesNoRecord: every record fits the topic's
// max.message.bytes, but the batch the client builds of them does not. The
// broker refuses the batch; produced alone, every record is stored, and none
// fails.
func TestBatchTooLargeBlamesNoRecord(t *testing.T) {
	t.Parallel()
	c := limitedTopic(t, "lim.order", "3000")
	p := publisher(t, c, outboxkafka.Config{Topic: "lim.{aggregate_type}", MaxRecordBytes: 64 << 10})
	var msgs []outbox.Message
	for i := 0; i < 8; i++ {
		m := event("agg-"+string(rune('a'+i)), 1)
		m.Payload = noise(t, 1500)
		msgs = append(msgs, m)
	}
	if errs := p.Publish(testCtx(t), msgs); errs != nil {
		t.Fatalf("Publish errors %v, want every record stored", errs)
	}
	if n := len(consume(t, c, len(msgs), "lim.order")); n != len(msgs) {
		t.Fatalf("%d records stored, want %d", n, len(msgs))
	}
}

// TestMissingTopicIsItsRouteUnavailable: the publisher does not create
// topics; a record for a topic that does not exist fails as that topic's
// route being unavailable, never as permanent (create the topic and the
// events go out), and the other records of the call are stored.
func TestMissingTopicIsItsRouteUnavailable(t *testing.T) {
	t.Parallel()
	c := cluster(t, 2, "cls.order")
	p := publisher(t, c, outboxkafka.Config{Topic: "cls.{aggregate_type}", DeliveryTimeout: 10 * time.Second})
	lost := event("p-1", 1)
	lost.AggregateType = "payment"
	errs := p.Publish(testCtx(t), []outbox.Message{event("o-1", 1), lost, event("o-2", 1)})
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil {
		t.Fatalf("Publish errors %v, want only the missing topic's record to fail", errs)
	}
	if route, ok := outbox.UnavailableRoute(errs[1]); !ok || route != "cls.payment" || outbox.IsPermanent(errs[1]) {
		t.Fatalf("missing topic: %v, want an error marked RouteUnavailable(\"cls.payment\")", errs[1])
	}
}
