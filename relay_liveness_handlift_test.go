package outbox_test

// A quarantine set and lifted by hand (docs/operations.md, "Parked lanes"):
// a test written by the stop-33 adversarial review of the cursor's position
// inside a transaction, failing on the code it reviewed.

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestLivenessQuarantineLiftedByHand: n events of one aggregate written in
// one transaction, the first quarantined by hand (which leaves it as
// written, available_at = occurred_at), and the lane sweep running, as
// operations.md promises: "If you lift a quarantine by hand ... the sweep
// unparks the lane within LaneSweepInterval". Every relay's incremental
// claim passes the quarantined head (it is not in outbox_fresh_key_idx
// while quarantined). Lifted by hand, it went back into that index behind
// every cursor: not scheduled, not looked for, the sweep unparking only the
// events behind it, which are not heads. The lane waited for the full scan.
// The sweep now makes the head due too when it unparks a lane.
func TestLivenessQuarantineLiftedByHand(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 40} {
		t.Run(map[int]string{1: "single", 40: "bulk"}[n], func(t *testing.T) {
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
			head := writeQuarantinedByHand(t, pool, w, schema, "lane", n)
			writeEventsFor(t, pool, w, "after-1")
			r.Wake()
			publishedSoon(t, pool, schema, "events written after a quarantined head", "after-1")
			outboxtest.Eventually(t, livenessWait, "the sweep parks the lane", func() bool {
				var flagged bool
				var parked int
				if err := pool.QueryRow(ctx, `SELECT (SELECT parked_at IS NOT NULL FROM `+schema+`.outbox_aggregates WHERE aggregate_id = 'lane'),
					(SELECT count(*) FROM `+schema+`.outbox_events WHERE available_at = 'infinity')`).Scan(&flagged, &parked); err != nil {
					t.Fatal(err)
				}
				return flagged && parked == n-1
			})
			if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = NULL WHERE event_id = $1`, head); err != nil {
				t.Fatal(err)
			}
			writeEventsFor(t, pool, w, "after-2")
			r.Wake()
			publishedSoon(t, pool, schema, "a lane whose quarantine was lifted by hand", "lane", "after-2")
		})
	}
}

// writeQuarantinedByHand writes n events of aggregate id in one
// transaction and quarantines the first by hand, in that transaction; it
// returns the first's id.
func writeQuarantinedByHand(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, schema, id string, n int) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var head uuid.UUID
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = orderEvent(id, "Tick")
		}
		recs, err := w.InsertTx(ctx, tx, evs...)
		if err != nil {
			return err
		}
		head = recs[0].ID
		_, err = tx.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now(), last_error = 'by hand' WHERE event_id = $1`, head)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return head
}
