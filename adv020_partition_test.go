package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestAdv020WriteDuringPartitionConversionLeavesCounterBehind: lane_bases
// decides "partitioned" in its DECLARE, before it takes outbox_events'
// lock. A READ COMMITTED write that starts while outbox migrate
// --partitioned holds that lock (its swap: copying the indexes, making the
// counters exact) reads pg_get_partkeydef of the old, plain table (false),
// then waits at PERFORM FROM outbox_events; once the swap commits it goes
// on against the new partitioned table on the floor path: it numbers its
// event after the lane's last one but leaves the counter where the
// conversion put it. On the partitioned table the counter is all that keeps
// sequences apart (no UNIQUE index across partitions): the next write takes
// the same sequence again.
//
// Interleaving: B locks lane "pin"'s counter row; the conversion locks
// outbox_events and waits for that row in its counter UPDATE; a write to
// "x" starts and waits for outbox_events; B commits; the conversion
// commits; the write commits x=3 with counter 2; the next write to "x"
// gets 3 as well.
func TestAdv020WriteDuringPartitionConversionLeavesCounterBehind(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	for range 2 { // floors 1, lanes at 2: the conversion raises both
		writeEventsFor(t, pool, w, "pin")
		writeEventsFor(t, pool, w, "x")
	}
	b, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Rollback(ctx) }()
	if _, err := b.Exec(ctx, `SELECT 1 FROM `+schema+`.outbox_aggregates WHERE aggregate_id = 'pin' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	waiting := func(like string) func() bool {
		return func() bool {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE $1`, like).Scan(&n); err != nil {
				t.Error(err)
				return true
			}
			return n > 0
		}
	}
	conv := make(chan error, 1)
	go func() {
		_, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{})
		conv <- err
	}()
	outboxtest.Eventually(t, 30*time.Second, "the conversion waits for pin's counter row under its lock on outbox_events",
		waiting(`UPDATE %`+schema+`%outbox_aggregates%`))
	wrote := make(chan error, 1)
	go func() {
		wrote <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, orderEvent("x", "Tick")); return err })
	}()
	outboxtest.Eventually(t, 30*time.Second, "the write to x waits for outbox_events", waiting(`%`+schema+`%enqueue%`))
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-conv; err != nil {
		t.Fatalf("conversion: %v", err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write during the conversion: %v", err)
	}
	// The next write to x (partitioned: it takes the counter, 2) gets 3.
	// In the kept partition (the old table, which keeps its UNIQUE index)
	// the index refuses it, and every later write to x, until writes land
	// in a newer partition (the kept one ends an interval after now); an
	// event whose id falls in a newer partition (here: an id three hours
	// ahead, as once the clock passes the kept partition's end) has no
	// UNIQUE index to stop it.
	errNow := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, orderEvent("x", "Tick")); return err })
	ahead := orderEvent("x", "Tick")
	ahead.ID = uuid.Must(uuid.NewV7())
	bound := partman.Bound(time.Now().Add(3 * time.Hour))
	copy(ahead.ID[:6], bound[:6])
	errAhead := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, ahead); return err })
	var got string
	var counter int64
	if err := pool.QueryRow(ctx, `SELECT string_agg(aggregate_sequence::text, ' ' ORDER BY aggregate_sequence),
		(SELECT last_sequence FROM `+schema+`.outbox_aggregates WHERE aggregate_id = 'x')
		FROM `+schema+`.outbox_events WHERE aggregate_id = 'x'`).Scan(&got, &counter); err != nil {
		t.Fatal(err)
	}
	if errNow != nil || errAhead != nil || got != "1 2 3 4 5" {
		t.Fatalf("after a write that waited for the conversion, lane x has sequences %q (counter %d), want \"1 2 3 4 5\"; the next write returned %v, one in a newer partition %v: the waiting write took the floor path on the partitioned table and left the counter behind its event", got, counter, errNow, errAhead)
	}
}

// TestAdv020LaneSweepDeadlocksThePartitionedConversion: the conversion now
// updates every counter row below its lane's last event while it holds
// ACCESS EXCLUSIVE on outbox_events ("writers take outbox_events' lock
// before their counter rows, so none holds one while waiting for this").
// The relay's lane sweep (sweepLane) does not: it takes a parked lane's
// counter row FOR UPDATE SKIP LOCKED in a fresh transaction, then reads
// the lane's end (laneLastSQL) and head from outbox_events. The transaction
// below runs sweepLane's statements verbatim (since the fix, it locks
// outbox_events first, and the conversion waits for the sweep to end).
//
// Interleaving: the sweep locks pin's counter row; the conversion locks
// outbox_events and waits for that row; the sweep's laneLast statement
// waits for outbox_events: a deadlock, and PostgreSQL aborts one of them
// (the conversion, whose wait began first) with 40P01.
func TestAdv020LaneSweepDeadlocksThePartitionedConversion(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	for range 2 { // floor 1, lane at 2: the conversion updates the row
		writeEventsFor(t, pool, w, "pin")
	}
	// The lane index a conversion builds first (CREATE INDEX CONCURRENTLY
	// IF NOT EXISTS), as a conversion run again finds it: that build would
	// wait for the sweep's transaction, before the swap, not in it.
	if _, err := pool.Exec(ctx, `CREATE INDEX outbox_events_lane_idx ON `+schema+`.outbox_events (aggregate_type, aggregate_id, aggregate_sequence)`); err != nil {
		t.Fatal(err)
	}
	sweep, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sweep.Rollback(ctx) }()
	// sweepLane's first statement since the fix: outbox_events' lock
	// (its parent only) before the counter row.
	if _, err := sweep.Exec(ctx, `LOCK TABLE ONLY `+schema+`.outbox_events IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	var parked bool
	var through *int64
	if err := sweep.QueryRow(ctx, `SELECT parked_at IS NOT NULL, parked_through FROM `+schema+`.outbox_aggregates
WHERE aggregate_type = $1 AND aggregate_id = $2 FOR UPDATE SKIP LOCKED`, "order", "pin").Scan(&parked, &through); err != nil {
		t.Fatal(err)
	}
	conv := make(chan error, 1)
	go func() {
		_, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{})
		conv <- err
	}()
	defer func() {
		rows, _ := pool.Query(context.Background(), `SELECT coalesce(wait_event_type,'') || ' ' || coalesce(wait_event,'') || ' ' || state || ' ' || left(query, 120) FROM pg_stat_activity WHERE datname = current_database()`)
		act, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, a := range act {
			t.Log(a)
		}
	}()
	outboxtest.Eventually(t, 30*time.Second, "the conversion waits for a lock the sweep holds", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE $1`, `%`+schema+`%`).Scan(&n); err != nil {
			t.Error(err)
			return true
		}
		return n > 0
	})
	var last int64
	sweepErr := sweep.QueryRow(ctx, `SELECT greatest(a.last_sequence, (SELECT x.aggregate_sequence FROM `+schema+`.outbox_events x
		WHERE x.aggregate_type = a.aggregate_type AND x.aggregate_id = a.aggregate_id
		ORDER BY x.aggregate_sequence DESC LIMIT 1)) FROM `+schema+`.outbox_aggregates a
WHERE a.aggregate_type = $1 AND a.aggregate_id = $2`, "order", "pin").Scan(&last)
	if sweepErr == nil {
		sweepErr = sweep.Commit(ctx)
	} else {
		_ = sweep.Rollback(ctx)
	}
	convErr := <-conv
	if sweepErr != nil || convErr != nil {
		t.Fatalf("lane sweep: %v; conversion: %v (want both to succeed, one after the other)", sweepErr, convErr)
	}
}
