package polyglot_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestNodeKafkaConsumer: the Go writer's events are published by a relay to
// a topic of franz-go's in-process kfake cluster (no Kafka server exists
// here), and consumer-kafka.js (npm kafkajs, the npm cloudevents package's
// Kafka binding, pg) applies each once, in sequence order, with every
// CloudEvents attribute as documented, the record key as the partition key.
func TestNodeKafkaConsumer(t *testing.T) {
	t.Parallel()
	needNodeModules(t, "kafkajs", "cloudevents", "pg")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	rolledBack := writeOrders(t, ctx, pool, schema)

	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	const topic = "outbox.order" // the publisher's default template; it creates no topic
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 3, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	pub, err := outboxkafka.NewPublisher(outboxkafka.Config{Brokers: c.ListenAddrs(), Source: source})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	runRelay(t, ctx, pool, schema, pub)

	env := append(nodeEnv(schema), "KAFKA_BROKERS="+strings.Join(c.ListenAddrs(), ","))
	lines, wait := startNode(t, ctx, env, "consumer-kafka.js", topic, "billing", itoa(expected))
	var report nodeReport
	lastJSON(t, lines, wait, &report)
	checkReport(t, report)
	checkReceived(t, ctx, pool, schema, "billing", rolledBack, true, time.Microsecond)
}
