package inventory_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

const waitFor = 20 * time.Second

type env struct {
	t              *testing.T
	pool           *pgxpool.Pool
	schema         string
	js             jetstream.JetStream
	stream, prefix string
	pub            *outboxnats.Publisher
	cons           *inventory.Consumer
}

// newEnv prepares a schema, a stream and subject prefix of the test's own
// and a consumer on them. start runs the consumer until the test ends.
func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	if err := inventory.Migrate(ctx, pool, schema, ""); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatalf("NATS is not reachable at %s (start it, or set NATS_URL): %v", outboxtest.NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := outboxtest.UniqueName(t, "inv")
	e := &env{t: t, pool: pool, schema: schema, js: js, stream: strings.ToUpper(name), prefix: name}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, e.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", e.stream, err)
		}
	})
	e.cons, err = inventory.New(pool, inventory.Config{
		Settings: inventory.Settings{Schema: schema, Stream: e.stream, SubjectPrefix: e.prefix, Durable: "inventory-test",
			AckWait: 5 * time.Second, RetryDelay: 50 * time.Millisecond},
		EarlyDelay: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) createStream() {
	e.t.Helper()
	var err error
	e.pub, err = outboxnats.NewPublisher(context.Background(), e.js, outboxnats.Config{Stream: e.stream, SubjectPrefix: e.prefix})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) start() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.cons.RunNATS(ctx, e.js) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			e.t.Error("Run did not return after its context ended")
		}
	})
}

func created(orderID string, seq int64, items ...orderevents.Item) outbox.Message {
	p, _ := json.Marshal(orderevents.OrderCreatedPayload{OrderID: orderID, CustomerID: "c", Items: items, CreatedAt: time.Now().UTC()})
	return message(orderID, seq, orderevents.OrderCreated, p)
}

func cancelled(orderID string, seq int64) outbox.Message {
	p, _ := json.Marshal(orderevents.OrderCancelledPayload{OrderID: orderID, CustomerID: "c", CancelledAt: time.Now().UTC()})
	return message(orderID, seq, orderevents.OrderCancelled, p)
}

func message(orderID string, seq int64, typ string, payload []byte) outbox.Message {
	return outbox.Message{ID: uuid.Must(uuid.NewV7()), AggregateType: orderevents.AggregateType, AggregateID: orderID,
		Sequence: seq, Type: typ, SchemaVersion: 1, Payload: payload, OccurredAt: time.Now().UTC(), Attempt: 1}
}

func (e *env) publish(msgs ...outbox.Message) {
	e.t.Helper()
	for i, err := range e.pub.Publish(context.Background(), msgs) {
		if err != nil {
			e.t.Fatalf("publish %d: %v", i, err)
		}
	}
}

// redeliver publishes a copy of the stream's last message on msg's subject
// under another Nats-Msg-Id, so the broker stores it again: the consumer
// receives a true duplicate delivery of the same event.
func (e *env) redeliver(msg outbox.Message) {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	raw, err := s.GetLastMsgForSubject(ctx, outboxnats.Subject(e.prefix, msg.AggregateType, msg.AggregateID))
	if err != nil {
		e.t.Fatal(err)
	}
	m := nats.NewMsg(raw.Subject)
	m.Data = raw.Data
	for k, v := range raw.Header {
		m.Header[k] = v
	}
	m.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

func (e *env) reserved() map[string]int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT sku, reserved FROM `+e.table("inventory_stock"))
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int64{}
	var sku string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&sku, &n}, func() error { out[sku] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) processed() int {
	return e.count(`SELECT count(*) FROM `+e.table("processed_events")+` WHERE consumer_name = $1`, inventory.InboxConsumerDefault)
}

func (e *env) mark(orderID string) int64 {
	e.t.Helper()
	n, err := e.cons.Inbox().LastSequence(context.Background(), orderevents.AggregateType, orderID)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) waitStats(what string, cond func(inventory.Stats) bool) {
	e.t.Helper()
	outboxtest.Eventually(e.t, waitFor, what, func() bool { return cond(e.cons.Stats()) })
}

func TestDuplicateDeliveryAppliedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createStream()
	e.start()
	msg := created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 3}, orderevents.Item{SKU: "B", Quantity: 1})
	e.publish(msg)
	e.waitStats("first delivery applied", func(s inventory.Stats) bool { return s.Applied == 1 })

	// The broker's deduplication drops a republish with the same event id...
	e.publish(msg)
	// ...so store a true duplicate under another message id, twice.
	e.redeliver(msg)
	e.redeliver(msg)
	e.waitStats("duplicates acknowledged", func(s inventory.Stats) bool { return s.Duplicates == 2 })

	if got := e.reserved(); got["A"] != 3 || got["B"] != 1 || len(got) != 2 {
		t.Fatalf("reserved %v, want A=3 B=1", got)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.table("inventory_reservations")); n != 2 {
		t.Fatalf("%d reservation rows, want 2", n)
	}
	if n := e.processed(); n != 1 {
		t.Fatalf("%d inbox rows, want 1", n)
	}
	if s := e.cons.Stats(); s.Applied != 1 || s.Delivered != 3 || s.Errors != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestOutOfOrderDeliveryWaitsForTheEarlierEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createStream()
	e.start()
	// The cancellation (sequence 2) reaches the stream before the creation.
	e.publish(cancelled("o-1", 2))
	e.waitStats("early delivery refused (twice, so it was redelivered)", func(s inventory.Stats) bool { return s.Early >= 2 })
	if s := e.cons.Stats(); s.Applied != 0 {
		t.Fatalf("applied %d events before sequence 1 arrived", s.Applied)
	}
	if got := e.reserved(); len(got) != 0 || e.mark("o-1") != 0 || e.processed() != 0 {
		t.Fatalf("state changed by an early event: reserved %v, mark %d, %d inbox rows", got, e.mark("o-1"), e.processed())
	}

	e.publish(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 5}))
	e.waitStats("both events applied", func(s inventory.Stats) bool { return s.Applied == 2 })
	if got := e.reserved(); got["A"] != 0 {
		t.Fatalf("reserved %v after create and cancel, want A=0", got)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.table("inventory_reservations") + ` WHERE order_id = 'o-1' AND status = 'released'`); n != 1 {
		t.Fatalf("%d released reservations, want 1", n)
	}
	if m := e.mark("o-1"); m != 2 {
		t.Fatalf("high-water mark %d, want 2", m)
	}
	if s := e.cons.Stats(); s.Anomalies != 0 || s.Errors != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestShuffledDeliveries publishes many orders' events in a random order,
// with duplicates, and checks that the workers end with exactly the stock of
// the non-cancelled orders.
func TestShuffledDeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createStream()
	e.start()
	rng := rand.New(rand.NewPCG(7, 7))
	skus := []string{"A", "B", "C", "D"}
	want := map[string]int64{}
	var msgs []outbox.Message
	const orders = 40
	for i := range orders {
		id := fmt.Sprintf("o-%d", i)
		var items []orderevents.Item
		for _, j := range rng.Perm(len(skus))[:1+rng.IntN(3)] {
			items = append(items, orderevents.Item{SKU: skus[j], Quantity: 1 + rng.IntN(4)})
		}
		msgs = append(msgs, created(id, 1, items...))
		if rng.IntN(3) == 0 {
			msgs = append(msgs, cancelled(id, 2))
		} else {
			for _, it := range items {
				want[it.SKU] += int64(it.Quantity)
			}
		}
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	// One message per aggregate per Publish call, as the relay does.
	for _, m := range msgs {
		e.publish(m)
	}
	for _, m := range msgs[:10] {
		e.redeliver(m)
	}
	e.waitStats("every event applied", func(s inventory.Stats) bool { return s.Applied == int64(len(msgs)) })
	e.waitStats("every duplicate acknowledged", func(s inventory.Stats) bool { return s.Duplicates >= 10 })
	got := e.reserved()
	for _, s := range skus {
		if got[s] != want[s] {
			t.Errorf("%s: reserved %d, want %d", s, got[s], want[s])
		}
	}
	if n := e.processed(); n != len(msgs) {
		t.Fatalf("%d inbox rows for %d events", n, len(msgs))
	}
	if s := e.cons.Stats(); s.Anomalies != 0 || s.Applied != int64(len(msgs)) {
		t.Fatalf("stats %+v", s)
	}
}

func TestWaitsForTheStreamAndRejectsUndecodable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start() // before any relay created the stream
	e.createStream()
	// A message that is not an outbox event is terminated, not retried.
	if _, err := e.js.Publish(context.Background(), e.prefix+".order.junk", []byte("junk")); err != nil {
		t.Fatal(err)
	}
	e.publish(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 2}))
	e.waitStats("event applied and junk rejected", func(s inventory.Stats) bool { return s.Applied == 1 && s.Rejected == 1 })
	if got := e.reserved(); got["A"] != 2 {
		t.Fatalf("reserved %v", got)
	}
}

// TestLostAck drops the ack after the commit (the failpoint between the two):
// the redelivery is recognised as a duplicate. Not parallel: failpoints are
// process-wide.
func TestLostAck(t *testing.T) {
	e := newEnv(t)
	if err := failpoint.Enable(inventory.FailpointAfterCommitBeforeAck+"=error@1", 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = failpoint.Enable("", 0) })
	e.createStream()
	e.start()
	e.publish(created("o-1", 1, orderevents.Item{SKU: "A", Quantity: 4}))
	e.waitStats("applied, then the redelivery acknowledged as a duplicate", func(s inventory.Stats) bool {
		return s.Applied == 1 && s.Duplicates == 1
	})
	if got := e.reserved(); got["A"] != 4 {
		t.Fatalf("reserved %v, want A=4", got)
	}
	if n := failpoint.Fired(inventory.FailpointAfterCommitBeforeAck); n != 1 {
		t.Fatalf("failpoint fired %d times", n)
	}
}
