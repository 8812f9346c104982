package outbox_test

// Breaking the incremental claim's liveness: shapes where a committed, due
// event is left to the full scan (an hour away in these tests).

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"context"
	"github.com/jackc/pgx/v5"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestLivenessPointsNotHeldByBlockedNonHeads: transactions running at the
// cursor's snapshot become its points. When more than a window of their
// events are not heads (each the second event of a lane whose head backs
// off for an hour), the points lookup reads the same window of them on
// every claim (ORDER BY dispatch_xid LIMIT window), the window counts as
// full, the points are kept, and an event of another point transaction,
// later in dispatch_xid order, is never read: a due head waits for the
// full scan. The documented exception is "more than a window of events of
// one transaction"; here they are six transactions, one event each.
func TestLivenessPointsNotHeldByBlockedNonHeads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if strings.HasPrefix(m.AggregateID, "busy-") && m.Sequence == 1 {
			return errors.New("try again")
		}
		return nil
	}}
	cfg := freshOnly(schema, pub)
	cfg.BatchSize = 4 // a window of 5
	cfg.RetryBackoffMin, cfg.RetryBackoffMax = time.Hour, time.Hour
	_, stop := startRelay(t, pool, cfg)
	defer stop()
	warmUp(t, pool, w, schema)
	var busy []string
	for i := 1; i <= 6; i++ {
		busy = append(busy, fmt.Sprintf("busy-%d", i))
	}
	writeEventsFor(t, pool, w, busy...)
	outboxtest.Eventually(t, livenessWait, "every busy head failed once", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events
			WHERE aggregate_id LIKE 'busy-%' AND attempt_count >= 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == len(busy)
	})
	begin := func() pgx.Tx {
		conn, err := pgx.Connect(ctx, outboxtest.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}
	// Six writers of blocked lanes, then the victim's: dispatch_xid order.
	var txs []pgx.Tx
	for _, id := range busy {
		tx := begin()
		if _, err := w.InsertTx(ctx, tx, orderEvent(id, "Tock")); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	victim := begin()
	if _, err := w.InsertTx(ctx, victim, orderEvent("victim", "Tick")); err != nil {
		t.Fatal(err)
	}
	txs = append(txs, victim)
	// A claim whose snapshot lists them all as running: they are its points.
	writeEventsFor(t, pool, w, "tick")
	publishedSoon(t, pool, schema, "an event written while the writers are open", "tick")
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	writeEventsFor(t, pool, w, "poke") // claims keep happening
	publishedSoon(t, pool, schema, "a head of a point transaction behind a window of blocked point events", "victim", "poke")
}

// TestLivenessReconcilerNotHeldByBlockedLane is TestLivenessBlockedLaneDoesNotHoldTheCursor
// for a relay with ReconcileAfter (CDC's safety net, here with no CDC
// beside it, as when the stream is down): its conservative cursor never
// passes an event it read and did not claim, so more than a window of a
// busy aggregate's events behind a head backing off for an hour holds it,
// and nothing written after them is reconciled before the full scan.
func TestLivenessReconcilerNotHeldByBlockedLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "busy" && m.Sequence == 1 {
			return errors.New("try again")
		}
		return nil
	}}
	cfg := freshOnly(schema, pub)
	cfg.BatchSize = 4 // a window of 5
	cfg.ReconcileAfter = 50 * time.Millisecond
	cfg.RetryBackoffMin, cfg.RetryBackoffMax = time.Hour, time.Hour
	_, stop := startRelay(t, pool, cfg)
	defer stop()
	warmUp(t, pool, w, schema)
	writeEventsFor(t, pool, w, "busy")
	outboxtest.Eventually(t, livenessWait, "the busy aggregate's head failed once", func() bool {
		var attempts int
		if err := pool.QueryRow(ctx, `SELECT attempt_count FROM `+schema+`.outbox_events WHERE aggregate_id = 'busy'`).Scan(&attempts); err != nil {
			t.Fatal(err)
		}
		return attempts == 1
	})
	for range 8 {
		writeEventsFor(t, pool, w, "busy")
	}
	writeEventsFor(t, pool, w, "bystander")
	publishedSoon(t, pool, schema, "an event written after a blocked lane's window, by the reconciler", "bystander")
}
