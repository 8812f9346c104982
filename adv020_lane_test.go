package outbox_test

import (
	"context"
	"testing"
	"time"

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

// TestAdv020RollingUpgradeWriterReusesASequenceCleanUpDeleted: migration
// 020 says a writer of the previous version (019's enqueue_one: upsert
// last_sequence + 1) beside 020's functions gets 23505 "where they could
// differ, never a duplicate". It takes last_sequence + 1 from a floor
// that 020's writes left behind; when clean-up has deleted the events
// between the floor and the lane's end (not the last one, so no raise), the
// UNIQUE index no longer refuses it and a deleted sequence is written again.
//
// Sequence: 020 writes 1, 2, 3 (floor 1); 1 and 2 published and cleaned
// up; the 019 statement takes 2.
func TestAdv020RollingUpgradeWriterReusesASequenceCleanUpDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	for range 3 {
		writeEventsFor(t, pool, w, "up")
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '2 days'
		WHERE aggregate_id = 'up' AND aggregate_sequence <= 2`); err != nil {
		t.Fatal(err)
	}
	var deleted int64
	if err := pool.QueryRow(ctx, `SELECT `+schema+`.cleanup_events('1 day', 100)`).Scan(&deleted); err != nil {
		t.Fatal(err)
	}
	if deleted != 2 {
		t.Fatalf("clean-up deleted %d events, want 2", deleted)
	}
	// 019's enqueue_one, its sequence and insert (migration 013, lines 240-252).
	var seq int64
	err := pool.QueryRow(ctx, `WITH s AS (
	INSERT INTO `+schema+`.outbox_aggregates AS a (aggregate_type, aggregate_id, last_sequence)
	VALUES ('order', 'up', 1)
	ON CONFLICT (aggregate_type, aggregate_id)
	DO UPDATE SET last_sequence = a.last_sequence + 1,
		parked_through = CASE WHEN a.parked_through = a.last_sequence THEN a.last_sequence + 1 ELSE a.parked_through END
	RETURNING a.last_sequence, a.parked_at)
INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type,
	schema_version, payload_bytes, headers, content_type, available_at)
SELECT gen_random_uuid(), 'order', 'up', s.last_sequence, 'Tick', 1, '{}'::bytea, '{}'::jsonb, NULL, now() FROM s
RETURNING aggregate_sequence`).Scan(&seq)
	if err == nil && seq <= 3 {
		t.Fatalf("a 019 write beside 020's took sequence %d, which clean-up deleted (the lane is at 3): a sequence reused, not refused with 23505", seq)
	}
	t.Logf("refused: %v", err)
}

// TestAdv020CleanUpWaitsForAWriterCreatingACounterRow: clean-up gives a
// lane without a counter row one (floored: INSERT ... ON CONFLICT DO
// NOTHING) before deleting its last event. That insert waits for any
// transaction that inserted the same key and is still open: a writer whose
// first event on the lane created the row. Clean-up (which holds its batch
// of event rows FOR UPDATE meanwhile) then waits as long as the
// application's transaction stays open; it took no counter row before 020,
// and everywhere else it takes them SKIP LOCKED.
//
// Interleaving: an event of lane "hand" written by hand (sequence 5,
// published two days ago, no counter row); a writer's open transaction
// writes to "hand" (creates the counter row); clean-up runs.
func TestAdv020CleanUpWaitsForAWriterCreatingACounterRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence,
		event_type, payload_bytes, published_at) VALUES (gen_random_uuid(), 'order', 'hand', 5, 'Tick', '{}'::bytea, now() - interval '2 days')`); err != nil {
		t.Fatal(err)
	}
	writer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Rollback(ctx) }()
	if _, err := w.InsertTx(ctx, writer, orderEvent("hand", "Tick")); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var deleted int64
	err = pool.QueryRow(cctx, `SELECT `+schema+`.cleanup_events('1 day', 100)`).Scan(&deleted)
	if err != nil {
		t.Fatalf("clean-up did not return within 5 s while a writer's transaction that created lane hand's counter row stays open: %v (it waits for that transaction to end)", err)
	}
}
