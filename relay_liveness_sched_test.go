package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestLivenessFreshSuccessorOfScheduledHead: a lane's first events are
// scheduled (their available_at moved: retried, released), and its next
// event is written due by a later transaction while they are pending. The
// incremental claim reads that event in the fresh range, passes it (not a
// head), and must still publish it once the heads before it are published,
// without the full scan (an hour away). Found by TestInterleavings
// (schedule #2774 of seed 1).
func TestLivenessFreshSuccessorOfScheduledHead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := freshOnly(schema, b.pub)
	cfg.BatchSize = 2
	cfg.PollInterval, cfg.DisableNotify, cfg.DisableClaimAhead = time.Hour, true, true
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	write := func(id string, n int) {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = orderEvent(id, "Tick")
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := w.InsertTx(ctx, tx, evs...); err != nil {
				return err
			}
			// Scheduled, as a retried or released event is, and due.
			_, err := tx.Exec(ctx, `UPDATE `+schema+`.outbox_events SET available_at = occurred_at - interval '1 second'
				WHERE aggregate_id = $1 AND published_at IS NULL`, id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	write("c", 2)
	write("b", 3)
	write("j", 1)
	if _, err := pool.Exec(ctx, `WITH a AS (UPDATE `+schema+`.outbox_aggregates SET last_sequence = last_sequence + 1
		WHERE aggregate_type = 'order' AND aggregate_id = 'b' RETURNING last_sequence)
		INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'b', a.last_sequence, 'Tick', '{}' FROM a`); err != nil {
		t.Fatal(err)
	}
	write("d", 3)
	write("c", 3)
	r.Wake()
	outboxtest.Eventually(t, livenessWait, "all 13 events published without the full scan", func() bool {
		if countUnpublished(t, pool, schema) == 0 {
			return true
		}
		r.Wake()
		return false
	})
}
