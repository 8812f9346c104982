package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestAdv020RepeatableReadWriterReusesASequenceCleanUpDeleted: a REPEATABLE
// READ writer's snapshot predates two READ COMMITTED writes (2 and 3) that
// only lock the counter row. Clean-up then deletes 2 (not the lane's last
// event: 3 follows, so no floor raise and no new counter version). The
// REPEATABLE READ write locks the counter row without a serialization
// failure (no new version since its snapshot), reads base =
// greatest(floor 1, last event it sees 1) = 1 and inserts sequence 2: the
// UNIQUE index no longer holds 2, so a sequence whose event was deleted is
// handed out again (after 3). Before 020 the READ COMMITTED writes moved
// the counter and this write failed with 40001.
func TestAdv020RepeatableReadWriterReusesASequenceCleanUpDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	writeEventsFor(t, pool, w, "rr") // 1, floor 1
	late, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	if _, err := late.Exec(ctx, `SELECT 1`); err != nil { // its snapshot
		t.Fatal(err)
	}
	writeEventsFor(t, pool, w, "rr") // 2
	writeEventsFor(t, pool, w, "rr") // 3
	// 1 and 2 published long ago (the relay's work), 3 not yet.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '2 days'
		WHERE aggregate_id = 'rr' AND aggregate_sequence <= 2`); err != nil {
		t.Fatal(err)
	}
	var deleted int64
	if err := pool.QueryRow(ctx, `SELECT `+schema+`.cleanup_events('1 day', 100)`).Scan(&deleted); err != nil {
		t.Fatal(err)
	}
	if deleted != 2 {
		t.Fatalf("clean-up deleted %d events, want 2", deleted)
	}
	recs, err := w.InsertTx(ctx, late, orderEvent("rr", "Tick"))
	if err == nil {
		err = late.Commit(ctx)
	}
	if err == nil {
		t.Fatalf("the REPEATABLE READ write committed sequence %d after clean-up deleted 1 and 2 and the lane reached 3: a deleted sequence handed out again (want a 40001 or 23505 refusal)", recs[0].Sequence)
	}
	t.Logf("refused: %v", err)
}
