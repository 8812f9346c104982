package outbox_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// enqueueBuffers is the shared buffers one enqueue of aggregate id touches
// (EXPLAIN (ANALYZE, BUFFERS) of the SQL write API, the writer's own call,
// in a transaction rolled back).
func enqueueBuffers(t *testing.T, pool *pgxpool.Pool, schema, id string) int {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) SELECT * FROM `+schema+`.enqueue('order', $1, 'Tick', '{}'::text)`, id)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?(?: dirtied=\d+)?`)
	for _, line := range plan {
		if m := re.FindStringSubmatch(line); m != nil {
			h, _ := strconv.Atoi(m[1])
			r, _ := strconv.Atoi(m[2])
			return h + r
		}
	}
	t.Fatalf("no buffers in the plan: %v", plan)
	return 0
}

// TestWriteFlatUnderPinnedXmin writes 40 events to each of 101 aggregates while a
// transaction holds the xmin horizon. A write used to update the
// aggregate's counter row, and the next one walked every version of it that
// vacuum could not remove: about one buffer more per event written to the
// aggregate since the horizon was pinned. Since migration 020 a write locks
// the row without a new version and reads the lane's last event.
func TestWriteFlatUnderPinnedXmin(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	writeEventsFor(t, pool, w, "flat")
	pinXmin(t)
	writeEventsFor(t, pool, w, "flat")
	// The least of three: the first call on a connection also reads the
	// catalog for its plans.
	least := func() int {
		return min(enqueueBuffers(t, pool, schema, "flat"), enqueueBuffers(t, pool, schema, "flat"), enqueueBuffers(t, pool, schema, "flat"))
	}
	before := least()
	// 40 writes to each of 100 aggregates, whose counter rows share pages:
	// each version of a row lands on a page of its own, a buffer each.
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = "flat-" + strconv.Itoa(i)
	}
	for range 40 {
		writeEventsFor(t, pool, w, append(ids, "flat")...)
	}
	after := least()
	t.Logf("an enqueue touched %d buffers before 40 writes to each of 101 aggregates, %d after", before, after)
	if after > before+10 {
		t.Fatalf("an enqueue touched %d buffers after 40 writes to its aggregate under a pinned xmin, %d before: it grows with the counter row's versions", after, before)
	}
	var last, count int64
	if err := pool.QueryRow(context.Background(), `SELECT `+schema+`.lane_last('order', 'flat'),
		(SELECT count(DISTINCT aggregate_sequence) FROM `+schema+`.outbox_events WHERE aggregate_id = 'flat')`).Scan(&last, &count); err != nil {
		t.Fatal(err)
	}
	if last != 42 || count != 42 {
		t.Fatalf("lane_last %d and %d distinct sequences, want 42 and 42", last, count)
	}
}

// TestSequenceContinuesAfterCleanUpDeletesTheLanesLastEvent: a write takes
// its sequence from the lane's last event or the counter row's floor.
// Clean-up raises the floor before it deletes a lane's last event, so the
// next event is never given a sequence the lane already had (a consumer's
// inbox would take it for a redelivery and drop it). A lane whose counter
// row a writer holds keeps its last event until the next clean-up.
func TestSequenceContinuesAfterCleanUpDeletesTheLanesLastEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	// One transaction each: the counter rows stay at 1, floors below
	// their lanes' ends.
	for _, id := range []string{"gone", "gone", "gone", "held", "held", "kept"} {
		writeEventsFor(t, pool, w, id)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '2 days'
		WHERE aggregate_id IN ('gone', 'held')`); err != nil {
		t.Fatal(err)
	}
	// A writer's transaction holds the counter row of "held".
	writer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Rollback(ctx) }()
	if _, err := w.InsertTx(ctx, writer, orderEvent("held", "Tick")); err != nil {
		t.Fatal(err)
	}
	var deleted int64
	if err := pool.QueryRow(ctx, `SELECT `+schema+`.cleanup_events('1 day', 100)`).Scan(&deleted); err != nil {
		t.Fatal(err)
	}
	if deleted != 3 { // gone 1-3 (the floor raised to 3); held waits whole
		t.Fatalf("clean-up deleted %d events, want 3", deleted)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	writeEventsFor(t, pool, w, "gone", "held", "kept")
	seqs := map[string][]int64{}
	rows, err := pool.Query(ctx, `SELECT aggregate_id, aggregate_sequence FROM `+schema+`.outbox_events ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			t.Fatal(err)
		}
		seqs[id] = append(seqs[id], seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"gone": "[4]", "held": "[1 2 3 4]", "kept": "[1 2]"}
	for id, s := range want {
		if got := fmtSeqs(seqs[id]); got != s {
			t.Errorf("lane %s: sequences %s, want %s", id, got, s)
		}
	}
	// Everything published and past the horizon: the floors keep every
	// lane's end.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now() - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT `+schema+`.cleanup_events('1 day', 100)`).Scan(&deleted); err != nil {
		t.Fatal(err)
	}
	writeEventsFor(t, pool, w, "gone", "held", "kept")
	var got string
	if err := pool.QueryRow(ctx, `SELECT string_agg(aggregate_id || '=' || aggregate_sequence, ' ' ORDER BY aggregate_id)
		FROM `+schema+`.outbox_events`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "gone=5 held=5 kept=3" {
		t.Fatalf("after a clean-up of everything, the next events are %q, want gone=5 held=5 kept=3", got)
	}
}

func fmtSeqs(s []int64) string {
	out := "["
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += strconv.FormatInt(v, 10)
	}
	return out + "]"
}

// TestRepeatableReadWriterNeverDuplicatesASequence: a REPEATABLE READ
// transaction's snapshot, taken before it locks the counter row, cannot see
// an event another writer committed since. Its write then fails, with a
// serialization failure (40001) when that writer moved the counter (another
// REPEATABLE READ one) or on the lane's UNIQUE index (23505) when it only
// locked it (READ COMMITTED); it never writes a sequence twice.
func TestRepeatableReadWriterNeverDuplicatesASequence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	writeEventsFor(t, pool, w, "rr")
	for _, other := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		late, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := late.Exec(ctx, `SELECT 1`); err != nil { // its snapshot
			t.Fatal(err)
		}
		if err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: other}, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, orderEvent("rr", "Tick"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		_, err = w.InsertTx(ctx, late, orderEvent("rr", "Tick"))
		_ = late.Rollback(ctx)
		var pgErr *pgconn.PgError
		want := map[pgx.TxIsoLevel]string{pgx.ReadCommitted: "23505", pgx.RepeatableRead: "40001"}[other]
		if !errors.As(err, &pgErr) || pgErr.Code != want {
			t.Fatalf("after a %s writer committed, the REPEATABLE READ write returned %v, want SQLSTATE %s", other, err, want)
		}
	}
	var n, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT aggregate_sequence) FROM `+schema+`.outbox_events`).Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != 3 || distinct != 3 {
		t.Fatalf("%d events with %d distinct sequences, want 3 and 3", n, distinct)
	}
}
