package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestCheckKafkaOrder checks that the Kafka read-back the destinations
// group relies on finds every event in order, and reports an aggregate's
// event stored before its predecessor, or after a gap.
func TestCheckKafkaOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msg := func(agg string, seq int64) outbox.Message {
		return outbox.Message{ID: uuid.Must(uuid.NewV7()), AggregateType: "order", AggregateID: agg, Sequence: seq,
			Type: "OrderUpdated", SchemaVersion: 1, ContentType: outbox.ContentTypeJSON, Payload: []byte(payload),
			OccurredAt: time.Now().UTC(), Attempt: 1}
	}
	for _, tc := range []struct {
		name    string
		batches [][]outbox.Message
		err     string
	}{
		{"in order", [][]outbox.Message{{msg("a", 1), msg("b", 1)}, {msg("a", 2), msg("b", 2)}, {msg("a", 3)}}, ""},
		{"successor first", [][]outbox.Message{{msg("a", 1)}, {msg("a", 3)}, {msg("a", 2)}}, "sequence 3 reached partition"},
		{"gap", [][]outbox.Message{{msg("b", 1)}, {msg("b", 3)}}, "I5 violated: aggregate order/b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkaPartitions, "t.order"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			pub, err := outboxkafka.NewPublisher(outboxkafka.Config{Brokers: c.ListenAddrs(), Topic: "t.{aggregate_type}"})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			n := 0
			for _, batch := range tc.batches {
				if errs := pub.Publish(ctx, batch); errs != nil {
					t.Fatal(errs)
				}
				n += len(batch)
			}
			got, err := checkKafkaOrder(ctx, c.ListenAddrs(), "t.order", n)
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err == "" && got != n:
				t.Fatalf("read %d distinct events, want %d", got, n)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}
