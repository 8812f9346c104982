package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// commitEvents records evs in a transaction of their own.
func commitEvents(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, evs ...outbox.Event) []outbox.Recorded {
	t.Helper()
	var recs []outbox.Recorded
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		recs, err = w.InsertTx(context.Background(), tx, evs...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return recs
}

// openWriter begins a transaction, records ev in it and leaves it open (a
// slow request, an idle-in-transaction session): the aggregate's counter
// row stays locked until the test commits it or the test ends.
func openWriter(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, ev outbox.Event) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertTx(ctx, tx, ev); err != nil {
		t.Fatal(err)
	}
	return tx
}

// publishedCount counts those of ids that are published (published_at set).
func publishedCount(t *testing.T, pool *pgxpool.Pool, schema string, ids []uuid.UUID) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+schema+`.outbox_events
		WHERE event_id = ANY($1) AND published_at IS NOT NULL`, ids).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func quarantinedAt(t *testing.T, pool *pgxpool.Pool, schema string, id uuid.UUID) bool {
	t.Helper()
	var q bool
	if err := pool.QueryRow(context.Background(), `SELECT quarantined_at IS NOT NULL FROM `+schema+`.outbox_events
		WHERE event_id = $1`, id).Scan(&q); err != nil {
		t.Fatal(err)
	}
	return q
}

// refuseAggregate is a publisher in front of NATS that refuses every event
// of aggregate id permanently.
func refuseAggregate(next outbox.Publisher, id string) outbox.Publisher {
	return failingPublisher{next: next, fail: func(m outbox.Message) error {
		if m.AggregateID == id {
			return outbox.Permanent(errors.New("refused " + id))
		}
		return nil
	}}
}

// TestOpenWriterDoesNotHoldTheRelay is the regression test of issue 19,
// item 1. A writer transaction is open on aggregate A (its counter row
// locked, event A#2 not committed) while the relay quarantines A#1. The
// settle that quarantines A#1 used to lock A's counter row to park the
// lane, so it waited for the writer, the relay's batch loop waited for the
// settle, and nothing was published for any aggregate. Now the settle takes
// the lanes it can without waiting: the quarantine and the other events'
// marks commit, 20 other aggregates are published while the writer is still
// open, and once the writer commits the lane sweep parks A#2 behind A#1.
// Nothing of A reaches the destination.
func TestOpenWriterDoesNotHoldTheRelay(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	first := commitEvents(t, pool, w, orderEvent("A", "Created"))[0]
	writer := openWriter(t, pool, w, orderEvent("A", "Paid"))
	r, _ := startRelay(t, pool, quietConfig(schema, refuseAggregate(b.pub, "A")))
	// Registered after the relay: runs before the relay is stopped, so that
	// a relay stuck behind the writer (the bug) can stop.
	t.Cleanup(func() { _ = writer.Rollback(context.Background()) })

	outboxtest.Eventually(t, 30*time.Second, "the relay refused A#1", func() bool { return r.Stats().Quarantined == 1 })
	var others []uuid.UUID
	for i := range 20 {
		others = append(others, commitEvents(t, pool, w, orderEvent(fmt.Sprintf("other-%d", i), "Created"))[0].ID)
	}
	outboxtest.Eventually(t, 30*time.Second, "the 20 other aggregates published while the writer is open", func() bool {
		return publishedCount(t, pool, schema, others) == len(others)
	})
	if !quarantinedAt(t, pool, schema, first.ID) {
		t.Fatal("A#1 is not quarantined in the table: the settle did not commit")
	}

	if err := writer.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the lane sweep parks A#2 behind the quarantined A#1", func() bool {
		s := readLane(t, pool, schema, "A")
		return s.headQuarantined && s.head == 1 && s.behind == 1 && s.behindParked == 1 && s.flagged
	})
	msgs := b.streamEvents(t)
	seen := checkBrokerOrder(t, msgs)
	for _, m := range msgs {
		if m.AggregateID == "A" {
			t.Fatalf("A#%d reached the destination behind its quarantined A#1", m.Sequence)
		}
	}
	if len(seen) != len(others) {
		t.Fatalf("%d events at the destination, want the %d other aggregates'", len(seen), len(others))
	}
}

// TestOpenWriterDoesNotHoldPublishIDs: the CDC path settles through the same
// code. A PublishIDs call that quarantines A#1 while a writer transaction is
// open on A returns without waiting for the writer; the next call publishes
// other aggregates; the lane sweep (of the polling relay beside it) parks
// A#2 once the writer committed.
func TestOpenWriterDoesNotHoldPublishIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	first := commitEvents(t, pool, w, orderEvent("A", "Created"))[0]
	writer := openWriter(t, pool, w, orderEvent("A", "Paid"))
	cfg := quietConfig(schema, refuseAggregate(b.pub, "A"))
	cfg.ID = "cdc"
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		res outbox.PublishIDsResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := r.PublishIDs(ctx, []uuid.UUID{first.ID})
		done <- result{res, err}
	}()
	t.Cleanup(func() {
		_ = writer.Rollback(context.Background())
		_ = r.WaitPublishIDs(context.Background())
	})
	var got result
	outboxtest.Eventually(t, 30*time.Second, "the PublishIDs call that quarantines A#1 returns while the writer is open", func() bool {
		select {
		case got = <-done:
			return true
		default:
			return false
		}
	})
	if got.err != nil || got.res.Failed != 1 || !quarantinedAt(t, pool, schema, first.ID) {
		t.Fatalf("PublishIDs: %+v, %v; A#1 quarantined %v: want A#1 failed and quarantined", got.res, got.err, quarantinedAt(t, pool, schema, first.ID))
	}
	var others []uuid.UUID
	for i := range 20 {
		others = append(others, commitEvents(t, pool, w, orderEvent(fmt.Sprintf("other-%d", i), "Created"))[0].ID)
	}
	res, err := r.PublishIDs(ctx, others)
	if err != nil || res.Published != len(others) {
		t.Fatalf("PublishIDs of the others: %+v, %v", res, err)
	}
	if err := r.WaitPublishIDs(ctx); err != nil {
		t.Fatal(err)
	}

	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.SweepLanes(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if s := readLane(t, pool, schema, "A"); !s.headQuarantined || s.behind != 1 || s.behindParked != 1 || !s.flagged {
		t.Fatalf("lane A after the sweep: %+v, want A#2 parked behind the quarantined A#1", s)
	}
	msgs := b.streamEvents(t)
	checkBrokerOrder(t, msgs)
	if len(msgs) != len(others) {
		t.Fatalf("%d events at the destination, want the %d others", len(msgs), len(others))
	}
}

// TestOperatorWaitingForAWriterDoesNotHoldTheRelay: an operator's Retry of
// a quarantined event waits for a writer transaction open on its aggregate
// (it must take the lane's counter row to unpark the lane), but holds
// nothing the relay needs: 20 other aggregates are published meanwhile, and
// once the writer commits, the retry ends and the lane drains in order.
func TestOperatorWaitingForAWriterDoesNotHoldTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	admin := newAdmin(t, pool, schema)
	var healed atomic.Bool
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "A" && !healed.Load() {
			return outbox.Permanent(errors.New("refused A"))
		}
		return nil
	}}
	first := commitEvents(t, pool, w, orderEvent("A", "Created"))[0]
	startRelay(t, pool, quietConfig(schema, pub))
	outboxtest.Eventually(t, 30*time.Second, "A#1 quarantined", func() bool { return quarantinedAt(t, pool, schema, first.ID) })

	writer := openWriter(t, pool, w, orderEvent("A", "Paid"))
	t.Cleanup(func() { _ = writer.Rollback(context.Background()) })
	healed.Store(true)
	retried := make(chan error, 1)
	go func() { _, err := admin.Retry(ctx, first.ID, "carol"); retried <- err }()
	outboxtest.Eventually(t, 30*time.Second, "the retry waits for the writer's counter row", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE %outbox_aggregates%' AND position($1 in query) > 0`, schema).Scan(&waiting)
		return err == nil && waiting
	})
	var others []uuid.UUID
	for i := range 20 {
		others = append(others, commitEvents(t, pool, w, orderEvent(fmt.Sprintf("other-%d", i), "Created"))[0].ID)
	}
	outboxtest.Eventually(t, 30*time.Second, "the 20 other aggregates published while the retry waits", func() bool {
		return publishedCount(t, pool, schema, others) == len(others)
	})
	select {
	case err := <-retried:
		t.Fatalf("the retry ended (%v) while the writer still held the lane", err)
	default:
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-retried; err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "lane A drained", func() bool { return unpublished(t, pool, schema) == 0 })
	lanes := checkOrderAllowingSkips(t, b.streamEvents(t))
	if len(lanes["order/A"]) != 2 || len(lanes) != 21 {
		t.Fatalf("at the destination: %d events of A over %d aggregates, want 2 over 21", len(lanes["order/A"]), len(lanes))
	}
}
