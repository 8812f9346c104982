package outboxkafka_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// Example publishes an event to Kafka and reads it back as a consumer would.
// It runs against kfake, the in-process Kafka-protocol cluster of franz-go;
// against a real cluster only Brokers changes.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "shop.order"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p, err := outboxkafka.NewPublisher(outboxkafka.Config{
		Brokers: cluster.ListenAddrs(),
		Topic:   "shop.{aggregate_type}",
		Source:  "/orders",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()

	msg := outbox.Message{
		ID:            uuid.MustParse("0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
		AggregateType: "order",
		AggregateID:   "o-42",
		Sequence:      1,
		Type:          "OrderCreated",
		SchemaVersion: 1,
		Payload:       []byte(`{"total":1299}`),
		Headers:       map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		OccurredAt:    time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	if errs := p.Publish(ctx, []outbox.Message{msg}); errs != nil {
		fmt.Println(errs[0])
		return
	}

	// A consumer reads the topic.
	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("shop.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer consumer.Close()
	var rec *kgo.Record
	for rec == nil && ctx.Err() == nil {
		fetches := consumer.PollFetches(ctx)
		if recs := fetches.Records(); len(recs) > 0 {
			rec = recs[0]
		}
	}
	if rec == nil {
		fmt.Println("no record")
		return
	}
	got, err := outboxkafka.Decode(rec)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("topic:", rec.Topic, "key:", string(rec.Key))
	for _, h := range rec.Headers {
		switch h.Key {
		case "ce_id", "ce_type", "ce_source", "ce_subject", "ce_time", "ce_sequence", "content-type":
			fmt.Printf("%s: %s\n", h.Key, h.Value)
		}
	}
	fmt.Println("decoded:", got.AggregateType, got.AggregateID, got.Sequence, got.Type, string(got.Payload), got.Headers["traceparent"])
	// Output:
	// topic: shop.order key: o-42
	// ce_id: 0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b
	// ce_type: OrderCreated
	// ce_source: /orders
	// ce_subject: o-42
	// ce_time: 2026-01-02T03:04:05Z
	// ce_sequence: 00000000000000000001
	// content-type: application/json
	// decoded: order o-42 1 OrderCreated {"total":1299} 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}

// ExampleTopic shows how an aggregate type becomes a topic.
func ExampleTopic() {
	fmt.Println(outboxkafka.Topic("shop.{aggregate_type}", "order"))
	fmt.Println(outboxkafka.Topic("shop.{aggregate_type}", "order/eu"))
	// Output:
	// shop.order <nil>
	//  aggregate type "order/eu": topic name "shop.order/eu": Kafka allows only [a-zA-Z0-9._-]
}

// ExampleParseURL reads a destination URL that authenticates with SCRAM over
// TLS; the password comes from OUTBOX_KAFKA_PASSWORD (set by the deployment,
// here by the example) and is never printed. The CA file is read at once.
func ExampleParseURL() {
	os.Setenv(outboxkafka.PasswordEnv, "s3cret-from-the-vault")
	defer os.Unsetenv(outboxkafka.PasswordEnv)
	cfg, err := outboxkafka.ParseURL("kafka://relay@k1:9092,k2?sasl=scram-sha-512&tls=true&ca_file=testdata/example-ca.pem")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.Brokers, cfg.SASLMechanism, cfg.User, cfg.TLS, cfg.CAFile)
	fmt.Println(cfg.Password == "s3cret-from-the-vault")
	fmt.Printf("%v\n", cfg)
	_, err = outboxkafka.ParseURL("kafka://relay@k1:9092")
	fmt.Println(err)
	// Output:
	// [k1:9092 k2:9092] SCRAM-SHA-512 relay true testdata/example-ca.pem
	// true
	// {Brokers:[k1:9092 k2:9092] Topic: Source: DeliveryTimeout:0s DialTimeout:0s MaxRecordBytes:0 SASLMechanism:SCRAM-SHA-512 User:relay Password:xxxxx TLS:true CAFile:testdata/example-ca.pem CertFile: KeyFile: TLSConfig:false}
	// outboxkafka: destination kafka://relay@k1:9092: a user needs sasl=plain, sasl=scram-sha-256 or sasl=scram-sha-512
}
