package outbox_test

// A quarantine set and lifted by hand (docs/operations.md, "Parked lanes"):
// tests written by the stop-33 adversarial review of the cursor's position
// inside a transaction, each failing on the code it reviewed.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestLivenessQuarantineLiftedByHandBulk: the same with the lane sweep
// running (every 100 ms), as operations.md promises: "If you lift a
// quarantine by hand ... the sweep unparks the lane within
// LaneSweepInterval". The sweep parks the 39 successors, then, after the
// lift, makes them due (scheduled); but they are not heads, and the head
// itself, as written, sits behind every relay's cursor. Nothing but the full
// scan read it: the lane never moved within the documented minute. The
// sweep now makes the head due too when it unparks a lane.
func TestLivenessQuarantineLiftedByHandBulk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, b.pub)
	cfg.BatchSize = 4
	cfg.LaneSweepInterval = 100 * time.Millisecond
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	warmUp(t, pool, w, schema)
	var recs []outbox.Recorded
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		evs := make([]outbox.Event, 40)
		for i := range evs {
			evs[i] = orderEvent("bulk", "Tick")
		}
		var err error
		if recs, err = w.InsertTx(ctx, tx, evs...); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now(), last_error = 'by hand' WHERE event_id = $1`, recs[0].ID)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	writeEventsFor(t, pool, w, "after-1")
	r.Wake()
	publishedSoon(t, pool, schema, "events written after a bulk write behind a quarantined head", "after-1")
	outboxtest.Eventually(t, livenessWait, "the sweep parks the lane", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE available_at = 'infinity'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 39
	})
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = NULL WHERE event_id = $1`, recs[0].ID); err != nil {
		t.Fatal(err)
	}
	r.Wake()
	writeEventsFor(t, pool, w, "after-2")
	r.Wake()
	publishedSoon(t, pool, schema, "a lane whose quarantine was lifted by hand, sweep on", "bulk", "after-2")
}

// TestLivenessQuarantineLiftedByHandSingle: the root of the two tests
// above, without a bulk write: one event, quarantined by hand while as
// written, its claim window not full, so the cursor moves to the snapshot's
// xmax past it (this part predates 30d29b5; the xid cursor passed it too).
// Lifted by hand, it is as written again, behind every cursor, neither
// scheduled nor looked for: it waited for the full scan. The sweep flags the
// lane of a quarantined head even with nothing behind it, and, once the
// quarantine is lifted, makes the head due. (With the sweep off too, only
// the full scan finds it, as operations.md says.)
func TestLivenessQuarantineLiftedByHandSingle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, b.pub)
	cfg.BatchSize = 4
	cfg.LaneSweepInterval = 100 * time.Millisecond
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	warmUp(t, pool, w, schema)
	var recs []outbox.Recorded
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if recs, err = w.InsertTx(ctx, tx, orderEvent("one", "Tick")); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now(), last_error = 'by hand' WHERE event_id = $1`, recs[0].ID)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	writeEventsFor(t, pool, w, "after-1")
	r.Wake()
	publishedSoon(t, pool, schema, "after", "after-1")
	outboxtest.Eventually(t, livenessWait, "the sweep flags the lane", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_aggregates WHERE aggregate_id = 'one' AND parked_at IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = NULL WHERE event_id = $1`, recs[0].ID); err != nil {
		t.Fatal(err)
	}
	writeEventsFor(t, pool, w, "after-2")
	r.Wake()
	publishedSoon(t, pool, schema, "single lifted", "one", "after-2")
}
