package destinationtest_test

import (
	"context"
	"crypto/rand"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/destinationtest"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// TestKafka runs the suite on Kafka, against franz-go's in-process
// Kafka-protocol cluster (kfake): no Kafka server exists on these machines.
// For the restart, the cluster persists to a directory of the test's own
// (kfake.DataDir, with SyncWrites) and is started again on the same port.
func TestKafka(t *testing.T) {
	t.Parallel()
	destinationtest.Run(t, destinationtest.Destination{
		AttributePrefix: "ce_",
		Open:            func(t *testing.T) destinationtest.Target { return kafkaTarget(t, false) },
		OpenRestartable: func(t *testing.T) destinationtest.Target { return kafkaTarget(t, true) },
	})
}

// kafkaMaxRecord is the publisher's MaxRecordBytes; the cluster's
// message.max.bytes, kafkaBrokerMax, is below it, so that a record between
// the two is sent and refused by the broker.
const (
	kafkaMaxRecord = 512 << 10
	kafkaBrokerMax = 256 << 10
)

func kafkaTarget(t *testing.T, restartable bool) destinationtest.Target {
	var topics []string
	for _, typ := range destinationtest.AggregateTypes {
		topic, err := outboxkafka.Topic(outboxkafka.TopicDefault, typ)
		if err != nil {
			t.Fatal(err)
		}
		topics = append(topics, topic)
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(4, topics...),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(kafkaBrokerMax)})}
	if restartable {
		opts = append(opts, kfake.DataDir(t.TempDir()), kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	brokers := c.ListenAddrs()
	p := kafkaPublisher(t, brokers)
	var restart func(t *testing.T)
	if restartable {
		restart = func(t *testing.T) {
			_, port, _ := net.SplitHostPort(brokers[0])
			n, _ := strconv.Atoi(port)
			c.Close()
			if c, err = kfake.NewCluster(append(opts, kfake.Ports(n))...); err != nil {
				t.Fatalf("start the cluster again: %v", err)
			}
		}
	}
	return destinationtest.Target{
		Publisher: p,
		Restart:   restart,
		Read: func(ctx context.Context, n int) ([]destinationtest.Delivery, error) {
			return readTopics(ctx, brokers, topics, n)
		},
		Unreachable: func(t *testing.T) outbox.Publisher {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			free := l.Addr().String()
			l.Close()
			return kafkaPublisher(t, []string{free})
		},
		Refuse: func(m outbox.Message) outbox.Message {
			m.Payload = make([]byte, kafkaMaxRecord+1)
			m.ContentType = "application/octet-stream"
			return m
		},
		RefuseAtDestination: func(m outbox.Message) outbox.Message {
			m.Payload = make([]byte, kafkaBrokerMax+1024) // compressed, the record still exceeds the broker's limit
			if _, err := rand.Read(m.Payload); err != nil {
				panic(err)
			}
			m.ContentType = "application/octet-stream"
			return m
		},
		Unroute: func(m outbox.Message) outbox.Message {
			m.AggregateType = "unrouted" // its topic does not exist (the publisher creates none)
			return m
		},
	}
}

func kafkaPublisher(t *testing.T, brokers []string) *outboxkafka.Publisher {
	// DeliveryTimeout bounds how long a record may wait for an answer; an
	// unrouted record's answer (the topic is unknown) takes a metadata
	// request and a retry, which took over 2 s under CI's load (the race
	// detector, two cores): the record then timed out and was reported
	// unavailable as a whole, not as its route.
	p, err := outboxkafka.NewPublisher(outboxkafka.Config{Brokers: brokers, MaxRecordBytes: kafkaMaxRecord,
		DeliveryTimeout: 15 * time.Second, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// readTopics reads the topics from the start with a client of its own until
// it has n records and no more arrive for a moment.
func readTopics(ctx context.Context, brokers, topics []string, n int) ([]destinationtest.Delivery, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []destinationtest.Delivery
	for {
		pollCtx := ctx
		var cancel context.CancelFunc = func() {}
		if len(out) >= n {
			pollCtx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
		}
		fs := cl.PollFetches(pollCtx)
		cancel()
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if err != context.DeadlineExceeded && err != context.Canceled {
				ferr = err
			}
		})
		if ferr != nil {
			return out, ferr
		}
		got := 0
		for _, r := range fs.Records() {
			m, err := outboxkafka.Decode(r)
			if err != nil {
				return out, err
			}
			a := map[string]string{}
			for _, h := range r.Headers {
				a[h.Key] = string(h.Value)
			}
			out = append(out, destinationtest.Delivery{Message: m, Attributes: a})
			got++
		}
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if len(out) >= n && got == 0 {
			return out, nil
		}
	}
}
