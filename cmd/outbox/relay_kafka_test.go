package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestRelayPublishesToKafka runs `outbox relay --destination kafka://…`
// started before its cluster (franz-go's in-process Kafka-protocol cluster,
// kfake: no Kafka server exists here): it waits, then publishes the pending
// event to topic outbox.order, keyed by its aggregate id, and an independent
// consumer decodes it back.
func TestRelayPublishesToKafka(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	id := insertEvent(t, pool, schema, "o-kafka", 1, "")
	port := freePort(t)
	relay := startRelayProcess(t, "--schema", schema,
		"--destination", fmt.Sprintf("kafka://127.0.0.1:%d?source=/relay-test", port),
		"--metrics-addr", "127.0.0.1:0", "--poll-interval", "50ms")
	addr := relay.metricsAddr(t)
	relay.waitingFor(t, addr, "destination")

	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(3, "outbox.order"))
	if err != nil {
		t.Fatalf("start kfake on port %d: %v", port, err)
	}
	t.Cleanup(c.Close)
	outboxtest.Eventually(t, 60*time.Second, "event published once the cluster is up", func() bool { return allPublished(ctx, pool, schema) })
	outboxtest.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := readyz(t, addr); return code == http.StatusOK })

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("outbox.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) == 0 && fctx.Err() == nil {
		recs = append(recs, cl.PollFetches(fctx).Records()...)
	}
	if len(recs) != 1 {
		t.Fatalf("%d records in outbox.order, want 1", len(recs))
	}
	m, err := outboxkafka.Decode(recs[0])
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != id || m.AggregateID != "o-kafka" || m.Sequence != 1 || string(recs[0].Key) != "o-kafka" {
		t.Fatalf("decoded %+v (key %q), want event %s of o-kafka, sequence 1", m, recs[0].Key, id)
	}
	relay.stop(t)
}
