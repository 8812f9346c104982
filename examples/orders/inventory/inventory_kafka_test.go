package inventory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// The Kafka tests run against franz-go's in-process Kafka-protocol cluster
// (kfake): no Kafka server exists where this is developed. The consumer
// only speaks the Kafka protocol.

const kafkaTopic = "outbox.order"

// kafkaEnv is a schema of the test's own, a kfake cluster with the order
// topic (4 partitions) and a publisher to it.
type kafkaEnv struct {
	*env
	cluster *kfake.Cluster
	kpub    *outboxkafka.Publisher
}

func newKafkaEnv(t *testing.T) *kafkaEnv {
	t.Helper()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	if err := inventory.Migrate(ctx, pool, schema, ""); err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, kafkaTopic), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	p, err := outboxkafka.NewPublisher(outboxkafka.Config{Brokers: c.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return &kafkaEnv{env: &env{t: t, pool: pool, schema: schema}, cluster: c, kpub: p}
}

// consumer returns a new consumer (a new member of the group "inv").
func (e *kafkaEnv) consumer() *inventory.Consumer {
	e.t.Helper()
	c, err := inventory.New(e.pool, inventory.Config{Settings: inventory.Settings{Schema: e.schema, Durable: "inv", Workers: 2,
		RetryDelay: 50 * time.Millisecond}, SessionTimeout: 2 * time.Second, EarlyDelay: 20 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	e.cons = c
	return c
}

// run runs c on the cluster until the returned stop is called (which
// waits for RunKafka to return).
func (e *kafkaEnv) run(c *inventory.Consumer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.RunKafka(ctx, e.cluster.ListenAddrs(), kafkaTopic) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("RunKafka: %v", err)
			}
		case <-time.After(20 * time.Second):
			e.t.Error("RunKafka did not return after its context ended")
		}
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *kafkaEnv) publishKafka(msgs ...outbox.Message) {
	e.t.Helper()
	for i, err := range e.kpub.Publish(context.Background(), msgs) {
		if err != nil {
			e.t.Fatalf("publish %d: %v", i, err)
		}
	}
}

// lag is the group's committed lag on the topic.
func (e *kafkaEnv) lag() int64 {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.cluster.ListenAddrs()...))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	committed, err := adm.FetchOffsets(ctx, "inv")
	if err != nil {
		e.t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, kafkaTopic)
	if err != nil {
		e.t.Fatal(err)
	}
	var lag int64
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(0)
		if c, ok := committed.Lookup(kafkaTopic, o.Partition); ok {
			at = c.At
		}
		lag += o.Offset - at
	})
	return lag
}

// orders returns n orders' events (every third one cancelled), one
// publication wave per sequence as the relay sends them, and the stock the
// orders leave reserved.
func orders(n int) (waves [2][]outbox.Message, want map[string]int64) {
	want = map[string]int64{}
	for i := range n {
		id := fmt.Sprintf("o-%d", i)
		sku := []string{"A", "B", "C"}[i%3]
		waves[0] = append(waves[0], created(id, 1, orderevents.Item{SKU: sku, Quantity: 1 + i%4}))
		if i%3 == 0 {
			waves[1] = append(waves[1], cancelled(id, 2))
		} else {
			want[sku] += int64(1 + i%4)
		}
	}
	return waves, want
}

func (e *env) checkStock(want map[string]int64) {
	e.t.Helper()
	got := e.reserved()
	for _, s := range []string{"A", "B", "C"} {
		if got[s] != want[s] {
			e.t.Errorf("%s: reserved %d, want %d", s, got[s], want[s])
		}
	}
}

// TestKafkaConsumerCommitsAfterApplying: the consumer group applies every
// order's events once and in order, commits its offsets (including on a
// graceful stop), and a new member of the group goes on from the committed
// offsets: nothing is delivered to it twice.
func TestKafkaConsumerCommitsAfterApplying(t *testing.T) {
	t.Parallel()
	e := newKafkaEnv(t)
	waves, want := orders(30)
	e.publishKafka(waves[0]...)
	e.publishKafka(waves[1]...)
	first := e.consumer()
	stop := e.run(first)
	total := int64(len(waves[0]) + len(waves[1]))
	e.waitStats("every event applied", func(s inventory.Stats) bool { return s.Applied == total })
	stop() // a graceful stop commits what was applied
	if n := e.lag(); n != 0 {
		t.Fatalf("after a graceful stop the group lags %d records", n)
	}
	if s := first.Stats(); s.Duplicates != 0 || s.Early != 0 || s.Anomalies != 0 || s.Errors != 0 {
		t.Fatalf("first member: %+v", s)
	}

	more := []outbox.Message{created("o-late", 1, orderevents.Item{SKU: "A", Quantity: 7})}
	want["A"] += 7
	e.publishKafka(more...)
	second := e.consumer()
	e.run(second)
	e.waitStats("the new event applied", func(s inventory.Stats) bool { return s.Applied == 1 })
	outboxtest.Eventually(t, waitFor, "the group's offsets committed to the end", func() bool { return e.lag() == 0 })
	if s := second.Stats(); s.Delivered != 1 || s.Duplicates != 0 {
		t.Fatalf("second member: %+v; want only the new event delivered", s)
	}
	e.checkStock(want)
	if n := e.processed(); n != int(total)+1 {
		t.Fatalf("%d inbox rows for %d events", n, total+1)
	}
}

// TestKafkaRedeliveryAfterCrashBeforeCommit: a consumer applied events (its
// inbox transactions committed) and died before committing their offsets;
// the group delivers them again and the inbox applies each once.
func TestKafkaRedeliveryAfterCrashBeforeCommit(t *testing.T) {
	t.Parallel()
	e := newKafkaEnv(t)
	waves, want := orders(12)
	e.publishKafka(waves[0]...)
	e.publishKafka(waves[1]...)
	// The crashed consumer: applied the first wave, never committed.
	crashed := e.consumer()
	for _, m := range waves[0] {
		if _, err := crashed.Handle(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	c := e.consumer()
	e.run(c)
	total := int64(len(waves[0]) + len(waves[1]))
	e.waitStats("the rest applied", func(s inventory.Stats) bool { return s.Applied+s.Duplicates == total })
	outboxtest.Eventually(t, waitFor, "the group's offsets committed to the end", func() bool { return e.lag() == 0 })
	if s := c.Stats(); s.Duplicates != int64(len(waves[0])) || s.Applied != int64(len(waves[1])) || s.Early != 0 {
		t.Fatalf("stats %+v; want the %d redelivered events suppressed as duplicates", s, len(waves[0]))
	}
	e.checkStock(want)
}

// TestKafkaLostCommit drops the offset commit after the inbox transaction
// (the failpoint between the two): the consumer rejoins the group, the
// record comes again and is suppressed as a duplicate. Not parallel:
// failpoints are process-wide.
func TestKafkaLostCommit(t *testing.T) {
	e := newKafkaEnv(t)
	if err := failpoint.Enable(inventory.FailpointAfterCommitBeforeAck+"=error@1", 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = failpoint.Enable("", 0) })
	e.publishKafka(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 4}))
	e.run(e.consumer())
	e.waitStats("applied, then the redelivery suppressed as a duplicate", func(s inventory.Stats) bool {
		return s.Applied == 1 && s.Duplicates == 1
	})
	outboxtest.Eventually(t, waitFor, "the offset committed", func() bool { return e.lag() == 0 })
	if got := e.reserved(); got["A"] != 4 {
		t.Fatalf("reserved %v, want A=4", got)
	}
	if n := failpoint.Fired(inventory.FailpointAfterCommitBeforeAck); n != 1 {
		t.Fatalf("failpoint fired %d times", n)
	}
}

// TestKafkaSkipsUndecodable: a record that is not an outbox event is
// counted and skipped, and the events after it are applied.
func TestKafkaSkipsUndecodable(t *testing.T) {
	t.Parallel()
	e := newKafkaEnv(t)
	// The publisher's client flushes by hand (a call's records go out
	// together), so ProduceSync alone would wait forever: flush it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := e.kpub.Client()
	produced := make(chan error, 1)
	cl.Produce(ctx, &kgo.Record{Topic: kafkaTopic, Key: []byte("o-1"), Value: []byte("junk")}, func(_ *kgo.Record, err error) { produced <- err })
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	e.publishKafka(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 2}))
	e.run(e.consumer())
	e.waitStats("event applied and junk rejected", func(s inventory.Stats) bool { return s.Applied == 1 && s.Rejected == 1 })
	outboxtest.Eventually(t, waitFor, "the offsets committed past both", func() bool { return e.lag() == 0 })
}
