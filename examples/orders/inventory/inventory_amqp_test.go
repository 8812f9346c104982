package inventory_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// amqpEnv is a schema, an exchange and a consumer queue of the test's own on
// the machine's RabbitMQ (or a node of the test's own), and a publisher to
// the exchange.
type amqpEnv struct {
	*env
	url      string // the broker, without query
	exchange string
	queue    string
	ch       *amqp.Channel
	apub     *outboxamqp.Publisher
}

func newAMQPEnv(t *testing.T, brokerURL string) *amqpEnv {
	t.Helper()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	if err := inventory.Migrate(ctx, pool, schema, ""); err != nil {
		t.Fatal(err)
	}
	e := &amqpEnv{env: &env{t: t, pool: pool, schema: schema}, url: brokerURL, exchange: rabbittest.UniqueName("inv")}
	e.queue = inventory.AMQPQueue(e.exchange, "inv")
	conn := rabbittest.Conn(t, brokerURL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	e.ch = ch
	t.Cleanup(func() {
		if conn.IsClosed() {
			return
		}
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(e.queue, false, false, false)
			_ = ch.ExchangeDelete(e.exchange, false, false)
		}
	})
	// The queue is bound before anything is published, as the harness does.
	key, err := inventory.AMQPBindingKey("")
	if err != nil {
		t.Fatal(err)
	}
	if err := inventory.DeclareAMQPQueue(ch, e.exchange, e.queue, key); err != nil {
		t.Fatal(err)
	}
	if e.apub, err = outboxamqp.NewPublisher(outboxamqp.Config{URL: brokerURL, Exchange: e.exchange}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.apub.Close)
	return e
}

// destination is the URL the relay and "orders inventory" take.
func (e *amqpEnv) destination() string { return e.url + "?exchange=" + url.QueryEscape(e.exchange) }

func (e *amqpEnv) consumer() *inventory.Consumer {
	e.t.Helper()
	c, err := inventory.New(e.pool, inventory.Config{Settings: inventory.Settings{Schema: e.schema, Durable: "inv", Workers: 2,
		AckWait: 2 * time.Second, RetryDelay: 50 * time.Millisecond}, EarlyDelay: 20 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	e.cons = c
	return c
}

// run runs c through Run with the destination URL until the returned stop
// is called (which waits for Run to return).
func (e *amqpEnv) run(c *inventory.Consumer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, e.destination()) }()
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
				e.t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			e.t.Error("Run did not return after its context ended")
		}
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *amqpEnv) publishAMQP(msgs ...outbox.Message) {
	e.t.Helper()
	for i, err := range e.apub.Publish(context.Background(), msgs) {
		if err != nil {
			e.t.Fatalf("publish %d: %v", i, err)
		}
	}
}

// depth is the consumers' queue's count of messages ready for delivery.
func (e *amqpEnv) depth() int {
	e.t.Helper()
	q, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return q.Messages
}

// TestAMQPConsumerAppliesAndAcks: every order's events applied once and in
// order; a graceful stop acks what it handled, so the queue is empty and a
// second consumer on the queue gets only what is published later.
func TestAMQPConsumerAppliesAndAcks(t *testing.T) {
	t.Parallel()
	e := newAMQPEnv(t, rabbittest.URL())
	waves, want := orders(30)
	e.publishAMQP(waves[0]...)
	e.publishAMQP(waves[1]...)
	first := e.consumer()
	stop := e.run(first)
	total := int64(len(waves[0]) + len(waves[1]))
	e.waitStats("every event applied", func(s inventory.Stats) bool { return s.Applied == total })
	stop()
	if n := e.depth(); n != 0 {
		t.Fatalf("after a graceful stop %d messages are back in the queue", n)
	}
	if s := first.Stats(); s.Duplicates != 0 || s.Anomalies != 0 || s.Errors != 0 || s.Delivered != total+s.Early {
		t.Fatalf("first consumer: %+v", s)
	}
	more := created("o-late", 1, orderevents.Item{SKU: "A", Quantity: 7})
	want["A"] += 7
	e.publishAMQP(more)
	second := e.consumer()
	e.run(second)
	e.waitStats("the new event applied", func(s inventory.Stats) bool { return s.Applied == 1 })
	if s := second.Stats(); s.Delivered != 1 || s.Duplicates != 0 {
		t.Fatalf("second consumer: %+v; want only the new event delivered", s)
	}
	e.checkStock(want)
}

// TestAMQPRedeliveryAfterCrashBeforeAck: a consumer received events,
// applied them (its inbox transactions committed) and died before acking;
// the broker requeues them, and the next consumer applies each event once.
func TestAMQPRedeliveryAfterCrashBeforeAck(t *testing.T) {
	t.Parallel()
	e := newAMQPEnv(t, rabbittest.URL())
	waves, want := orders(12)
	e.publishAMQP(waves[0]...)
	e.publishAMQP(waves[1]...)
	// The crashed consumer: takes the first wave from the queue, applies
	// it, and loses its connection without acking.
	crashed := e.consumer()
	conn, err := amqp.Dial(e.url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for range waves[0] {
		d, ok, err := ch.Get(e.queue, false)
		if err != nil || !ok {
			t.Fatalf("get: %v (a message: %v)", err, ok)
		}
		m, err := outboxamqp.Decode(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := crashed.Handle(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	_ = conn.Close()
	c := e.consumer()
	e.run(c)
	total := int64(len(waves[0]) + len(waves[1]))
	e.waitStats("the rest applied", func(s inventory.Stats) bool { return s.Applied+s.Duplicates == total })
	if s := c.Stats(); s.Duplicates != int64(len(waves[0])) || s.Applied != int64(len(waves[1])) {
		t.Fatalf("stats %+v; want the %d redelivered events suppressed as duplicates", s, len(waves[0]))
	}
	outboxtest.Eventually(t, waitFor, "the queue drained", func() bool { return e.depth() == 0 })
	e.checkStock(want)
	if n := e.processed(); n != int(total) {
		t.Fatalf("%d inbox rows for %d events", n, total)
	}
}

// TestAMQPOrderThroughTheInbox: an order's cancellation is in the queue
// before its creation (as a stale relay could leave it); the consumer
// refuses it as early, hands it back, and applies both in order.
func TestAMQPOrderThroughTheInbox(t *testing.T) {
	t.Parallel()
	e := newAMQPEnv(t, rabbittest.URL())
	e.run(e.consumer())
	e.publishAMQP(cancelled("o-1", 2))
	e.waitStats("early delivery refused (twice, so it was handed back)", func(s inventory.Stats) bool { return s.Early >= 2 })
	if got := e.reserved(); len(got) != 0 || e.mark("o-1") != 0 || e.processed() != 0 {
		t.Fatalf("state changed by an early event: reserved %v, mark %d, %d inbox rows", got, e.mark("o-1"), e.processed())
	}
	e.publishAMQP(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 5}))
	e.waitStats("both events applied", func(s inventory.Stats) bool { return s.Applied == 2 })
	if m := e.mark("o-1"); m != 2 {
		t.Fatalf("high-water mark %d, want 2", m)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.table("inventory_reservations") + ` WHERE order_id = 'o-1' AND status = 'released'`); n != 1 {
		t.Fatalf("%d released reservations, want 1", n)
	}
	outboxtest.Eventually(t, waitFor, "the queue drained", func() bool { return e.depth() == 0 })
}

// TestAMQPLostAck drops the ack after the inbox transaction (the failpoint
// between the two): the message comes again and is suppressed as a
// duplicate. Not parallel: failpoints are process-wide.
func TestAMQPLostAck(t *testing.T) {
	e := newAMQPEnv(t, rabbittest.URL())
	if err := failpoint.Enable(inventory.FailpointAfterCommitBeforeAck+"=error@1", 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = failpoint.Enable("", 0) })
	e.publishAMQP(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 4}))
	e.run(e.consumer())
	e.waitStats("applied, then the redelivery suppressed as a duplicate", func(s inventory.Stats) bool {
		return s.Applied == 1 && s.Duplicates == 1
	})
	outboxtest.Eventually(t, waitFor, "the queue drained", func() bool { return e.depth() == 0 })
	if got := e.reserved(); got["A"] != 4 {
		t.Fatalf("reserved %v, want A=4", got)
	}
}

// TestAMQPRejectsUndecodable: a message that is not an outbox event is
// counted and rejected, and the events after it are applied.
func TestAMQPRejectsUndecodable(t *testing.T) {
	t.Parallel()
	e := newAMQPEnv(t, rabbittest.URL())
	key, _ := inventory.AMQPBindingKey("")
	if err := e.ch.PublishWithContext(context.Background(), e.exchange, key, true, false, amqp.Publishing{Body: []byte("junk")}); err != nil {
		t.Fatal(err)
	}
	e.publishAMQP(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 2}))
	e.run(e.consumer())
	e.waitStats("event applied and junk rejected", func(s inventory.Stats) bool { return s.Applied == 1 && s.Rejected == 1 })
	outboxtest.Eventually(t, waitFor, "the queue drained", func() bool { return e.depth() == 0 })
}

// TestAMQPReconnectsAfterBrokerRestart: the consumer outlives a restart of
// its broker (a node of the test's own) and applies what is published
// after it; the durable queue kept what was published before.
func TestAMQPReconnectsAfterBrokerRestart(t *testing.T) {
	t.Parallel()
	node := rabbittest.Start(t)
	e := newAMQPEnv(t, node.URL())
	e.run(e.consumer())
	e.publishAMQP(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 1}))
	e.waitStats("applied before the restart", func(s inventory.Stats) bool { return s.Applied == 1 })
	node.Stop()
	node.Start()
	// The test's channel died with the broker: a new one for depth.
	conn := rabbittest.Conn(t, node.URL())
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	e.ch = ch
	var errs []error
	for _, err := range e.apub.Publish(context.Background(), []outbox.Message{created("o-2", 1, orderevents.Item{SKU: "B", Quantity: 2})}) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		// The publisher reconnects on the next call after a lost connection.
		e.publishAMQP(created("o-2", 1, orderevents.Item{SKU: "B", Quantity: 2}))
	}
	e.waitStats("applied after the restart", func(s inventory.Stats) bool { return s.Applied == 2 })
	outboxtest.Eventually(t, waitFor, "the queue drained", func() bool { return e.depth() == 0 })
	if got := e.reserved(); got["A"] != 1 || got["B"] != 2 {
		t.Fatalf("reserved %v, want A=1 B=2", got)
	}
}

// TestAMQPNeverPrintsThePassword: the consumer's log lines name the broker
// without the URL's password, also while it cannot connect.
func TestAMQPNeverPrintsThePassword(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	var logs syncBuffer
	c, err := inventory.New(pool, inventory.Config{Settings: inventory.Settings{Schema: schema, Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// A wrong password on the machine's broker, then an unreachable port.
	go func() { done <- c.Run(ctx, "amqp://guest:s3cret-pw@127.0.0.1:5672/?exchange=x") }()
	outboxtest.Eventually(t, waitFor, "a failed connection logged", func() bool { return strings.Contains(logs.String(), "reconnecting") })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() { done <- c.Run(ctx, "amqp://guest:s3cret-pw@127.0.0.1:1/?exchange=x") }()
	outboxtest.Eventually(t, waitFor, "a failed connection logged", func() bool {
		return strings.Count(logs.String(), "reconnecting") >= 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if strings.Contains(out, "s3cret-pw") || !strings.Contains(out, "guest:xxxxx@127.0.0.1") {
		t.Fatalf("logs show the password, or do not name the broker:\n%s", out)
	}
}

// syncBuffer is a bytes.Buffer written concurrently while the test reads it.
type syncBuffer = outboxtest.Buffer
