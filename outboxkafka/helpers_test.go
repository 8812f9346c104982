package outboxkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// cluster starts an in-process Kafka-protocol cluster (kfake) with the given
// topics, closed when the test ends.
func cluster(t *testing.T, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func publisher(t *testing.T, c *kfake.Cluster, cfg outboxkafka.Config) *outboxkafka.Publisher {
	t.Helper()
	cfg.Brokers = c.ListenAddrs()
	p, err := outboxkafka.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func event(aggregateID string, seq int64) outbox.Message {
	return outbox.Message{
		ID:            uuid.Must(uuid.NewV7()),
		AggregateType: "order",
		AggregateID:   aggregateID,
		Sequence:      seq,
		Type:          "OrderCreated",
		SchemaVersion: 1,
		ContentType:   outbox.ContentTypeJSON,
		Payload:       []byte(`{"n":1}`),
		OccurredAt:    time.Now().UTC(),
		Attempt:       1,
	}
}

func checkNil(t *testing.T, errs []error) {
	t.Helper()
	if errs != nil {
		t.Fatalf("Publish errors: %v", errs)
	}
}

// consume reads n records from topics with an independent client.
func consume(t *testing.T, c *kfake.Cluster, n int, topics ...string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := testCtx(t)
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records: %v", len(recs), n, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		recs = append(recs, fs.Records()...)
	}
	if len(recs) != n {
		t.Fatalf("read %d records, want %d", len(recs), n)
	}
	return recs
}
