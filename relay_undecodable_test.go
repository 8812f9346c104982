package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestUndecodableRowIsQuarantinedAlone is the regression test of issue 8,
// item 2: a row inserted by SQL whose headers are valid JSON but not a
// string map made the claim's scan fail after the claim had committed; the
// batch stayed leased and every later claim hit the same row, so nothing was
// published. Now that row is quarantined with a clear last_error, the events
// behind it wait (unclaimed), and every other aggregate is published.
func TestUndecodableRowIsQuarantinedAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	if _, err := pool.Exec(ctx, `
INSERT INTO `+schema+`.outbox_aggregates VALUES ('order', 'hand-made', 2);
INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, headers, occurred_at)
VALUES (gen_random_uuid(), 'order', 'hand-made', 1, 'OrderCreated', '{}', '{"retries": 3, "tags": ["a"]}', now() - interval '1 minute'),
       (gen_random_uuid(), 'order', 'hand-made', 2, 'OrderPaid', '{}', '{}', now() - interval '1 minute');`); err != nil {
		t.Fatal(err)
	}
	writeEvents(t, pool, w, 5, 3)
	r, _ := startRelay(t, pool, quietConfig(schema, b.pub))
	outboxtest.Eventually(t, 30*time.Second, "the other aggregates published", func() bool {
		return unpublished(t, pool, schema) == 2 && r.Stats().Quarantined == 1
	})
	var quarantined bool
	var lastErr string
	var attempts int
	var behindClaimed bool
	if err := pool.QueryRow(ctx, `SELECT
	(SELECT quarantined_at IS NOT NULL FROM `+schema+`.outbox_events WHERE aggregate_id = 'hand-made' AND aggregate_sequence = 1),
	(SELECT coalesce(last_error, '') FROM `+schema+`.outbox_events WHERE aggregate_id = 'hand-made' AND aggregate_sequence = 1),
	(SELECT attempt_count FROM `+schema+`.outbox_events WHERE aggregate_id = 'hand-made' AND aggregate_sequence = 1),
	(SELECT claim_token IS NOT NULL OR quarantined_at IS NOT NULL FROM `+schema+`.outbox_events WHERE aggregate_id = 'hand-made' AND aggregate_sequence = 2)`).
		Scan(&quarantined, &lastErr, &attempts, &behindClaimed); err != nil {
		t.Fatal(err)
	}
	if !quarantined || !strings.Contains(lastErr, "headers are not a JSON object of strings") || attempts != 1 || behindClaimed {
		t.Fatalf("hand-made #1 quarantined=%v last_error=%q attempts=%d, #2 held=%v: want #1 quarantined with the reason, #2 waiting unclaimed",
			quarantined, lastErr, attempts, behindClaimed)
	}
	msgs := b.streamEvents(t)
	checkBrokerOrder(t, msgs)
	if len(msgs) != 15 {
		t.Fatalf("%d events at the broker, want the 15 of the other aggregates", len(msgs))
	}

	// The operator repairs the row and retries it: the lane drains.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET headers = '{"retries": "3"}' WHERE aggregate_id = 'hand-made' AND aggregate_sequence = 1`); err != nil {
		t.Fatal(err)
	}
	admin := newAdmin(t, pool, schema)
	if _, err := admin.Retry(ctx, eventID(t, pool, schema, "hand-made", 1), "test"); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the repaired lane published", func() bool { return unpublished(t, pool, schema) == 0 })
	var repaired outbox.Message
	for _, m := range b.streamEvents(t) {
		if m.AggregateID == "hand-made" && m.Sequence == 1 {
			repaired = m
		}
	}
	if repaired.Headers["retries"] != "3" {
		t.Fatalf("repaired event's headers %v", repaired.Headers)
	}
}

// TestUndecodableRowBehindAPendingEventIsNotQuarantined is a regression
// test of issue 19, item 2. A row the relay cannot read, claimed as the
// successor of a pending head, used to be quarantined at claim time while
// its predecessor was still unpublished (k+1 quarantined while k was
// pending): an operator's skip of it then let k+2 out before k. Now it is
// released unattempted and quarantined only once it is the head of its lane;
// the events behind it wait parked, and after the skip go out in order,
// declaring the skip.
func TestUndecodableRowBehindAPendingEventIsNotQuarantined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	if _, err := pool.Exec(ctx, `
INSERT INTO `+schema+`.outbox_aggregates VALUES ('order', 'hand-made', 3);
INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, headers)
VALUES (gen_random_uuid(), 'order', 'hand-made', 1, 'OrderCreated', '{}', '{}'),
       (gen_random_uuid(), 'order', 'hand-made', 2, 'OrderPaid', '{}', '{"retries": 3}'),
       (gen_random_uuid(), 'order', 'hand-made', 3, 'OrderShipped', '{}', '{}');`); err != nil {
		t.Fatal(err)
	}
	var held atomic.Bool
	held.Store(true)
	var attempts atomic.Int64
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.Sequence == 1 && held.Load() {
			attempts.Add(1)
			return errors.New("destination busy, try again")
		}
		return nil
	}}
	cfg := quietConfig(schema, pub)
	cfg.MaxAttempts = 1 << 20
	startRelay(t, pool, cfg)
	second, first := eventID(t, pool, schema, "hand-made", 2), eventID(t, pool, schema, "hand-made", 1)
	admin := newAdmin(t, pool, schema)
	outboxtest.Eventually(t, 30*time.Second, "hand-made #1 tried three times", func() bool { return attempts.Load() >= 3 })
	if e, err := admin.Event(ctx, second); err != nil || e.State() != "pending" {
		t.Fatalf("hand-made #2 while #1 is pending: %+v (%v), want it pending, not quarantined", e, err)
	}

	held.Store(false)
	outboxtest.Eventually(t, 30*time.Second, "hand-made #2 quarantined once #1 is published", func() bool {
		e, err := admin.Event(ctx, second)
		return err == nil && e.State() == "quarantined"
	})
	if e, err := admin.Event(ctx, first); err != nil || e.State() != "published" {
		t.Fatalf("hand-made #1: %+v (%v), want it published before #2 was quarantined", e, err)
	}
	outboxtest.Eventually(t, 30*time.Second, "hand-made #3 parked behind #2", func() bool {
		s := readLane(t, pool, schema, "hand-made")
		return s.headQuarantined && s.head == 2 && s.behindParked == 1
	})
	if _, err := admin.Skip(ctx, second, "test", "headers written by hand"); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "hand-made drained", func() bool { return unpublished(t, pool, schema) == 0 })
	lanes := checkOrderAllowingSkips(t, b.streamEvents(t))
	got := lanes["order/hand-made"]
	if len(got) != 2 || got[0].Sequence != 1 || got[1].Sequence != 3 || got[1].SkippedFrom != 2 {
		t.Fatalf("at the destination: %+v, want #1 then #3 declaring #2 skipped", got)
	}
}
