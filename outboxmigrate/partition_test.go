package outboxmigrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

func partitionSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool := outboxtest.Pool(t)
	schema := outboxtest.UniqueName(t, "part")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	if _, err := outboxmigrate.Migrate(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

func enqueue(t *testing.T, pool *pgxpool.Pool, schema, agg string, id *uuid.UUID) error {
	t.Helper()
	_, err := pool.Exec(context.Background(), `SELECT `+schema+`.enqueue('order', $1, 'created', '{}'::text, id => $2)`, agg, id)
	return err
}

func partitions(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass ORDER BY 1`, schema+".outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		out = append(out, n)
	}
	return out
}

// A fresh schema converted has the interval's partitions (the one before
// now's, now's and Ahead more), every index of the plain table on the
// parent, no unique constraint but the primary key, and takes events
// through the SQL API; migrations applied again find it as they left it.
func TestPartitionFreshSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := partitionSchema(t)
	res, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{Interval: time.Hour, Ahead: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Converted || res.Kept != "" || len(res.Created) != 4 {
		t.Fatalf("result %+v, want converted, nothing kept, 4 partitions (previous, current, 2 ahead)", res)
	}
	if got := partitions(t, pool, schema); len(got) != 4 {
		t.Fatalf("partitions %v", got)
	}
	var kind string
	if err := pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, schema+".outbox_events").Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("relkind %q, %v", kind, err)
	}
	for _, idx := range []string{"outbox_events_pkey", "outbox_dispatch_idx", "outbox_pending_lane_idx", "outbox_fresh_key_idx",
		"outbox_due_idx", "outbox_skipped_idx", "outbox_published_at_idx", "outbox_quarantine_key_idx", "outbox_events_lane_idx"} {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, schema+"."+idx).Scan(&ok); err != nil || !ok {
			t.Errorf("index %s missing on the parent", idx)
		}
	}
	var fillfactor bool
	if err := pool.QueryRow(ctx, `SELECT bool_and('fillfactor=80' = ANY (c.reloptions)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, schema+".outbox_events").Scan(&fillfactor); err != nil || !fillfactor {
		t.Errorf("partitions lack the table's storage parameters (fillfactor=80): %v", err)
	}
	if err := enqueue(t, pool, schema, "o1", nil); err != nil {
		t.Fatal(err)
	}
	// The migrations are idempotent scripts: each runs again on the
	// partitioned table without error (what a later migration's ALTER,
	// CREATE INDEX and DO blocks meet).
	for _, m := range outboxmigrate.All() {
		if _, err := pool.Exec(ctx, "SET search_path TO "+schema+"; "+m.SQL+"; RESET search_path"); err != nil {
			t.Errorf("migration %d (%s) on a partitioned outbox: %v", m.Version, m.Name, err)
		}
	}
	again, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{Interval: time.Hour, Ahead: 2})
	if err != nil || again.Converted || len(again.Created) != 0 {
		t.Fatalf("second Partition: %+v, %v; want nothing to do", again, err)
	}
}

// A table with events keeps them, in place, as its first partition, with
// their unique constraint; writes go on into the new partitions; a relay's
// role keeps its rights on the parent.
func TestPartitionKeepsEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := partitionSchema(t)
	for _, a := range []string{"a", "b", "a"} {
		if err := enqueue(t, pool, schema, a, nil); err != nil {
			t.Fatal(err)
		}
	}
	role := strings.ToLower(outboxtest.UniqueName(t, "relayrole"))
	if _, err := pool.Exec(ctx, `CREATE ROLE `+role+` NOLOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		_, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	if _, err := pool.Exec(ctx, `GRANT SELECT, UPDATE (published_at) ON `+schema+`.outbox_events TO `+role); err != nil {
		t.Fatal(err)
	}
	res, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{Interval: time.Minute, Ahead: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Converted || res.Kept == "" {
		t.Fatalf("result %+v, want the old table kept as a partition", res)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d events after conversion (%v), want 3", n, err)
	}
	if err := enqueue(t, pool, schema, "a", nil); err != nil {
		t.Fatal(err)
	}
	var seq int64
	if err := pool.QueryRow(ctx, `SELECT max(aggregate_sequence) FROM `+schema+`.outbox_events WHERE aggregate_id = 'a'`).Scan(&seq); err != nil || seq != 3 {
		t.Fatalf("sequence %d (%v), want 3", seq, err)
	}
	var sel, upd, updOther bool
	if err := pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2, 'SELECT'), has_column_privilege($1, $2, 'published_at', 'UPDATE'),
	has_column_privilege($1, $2, 'payload', 'UPDATE')`, role, schema+".outbox_events").Scan(&sel, &upd, &updOther); err != nil {
		t.Fatal(err)
	}
	if !sel || !upd || updOther {
		t.Fatalf("rights on the parent: select %v, update(published_at) %v, update(payload) %v; want true, true, false", sel, upd, updOther)
	}
}

// Ids that are not time-ordered (UUIDv4s an application supplied) cannot
// be partitioned by time: Partition refuses, naming one, and leaves the
// table as it was.
func TestPartitionRefusesRandomIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := partitionSchema(t)
	id := uuid.MustParse("f47ac10b-58cc-4372-a567-0e02b2c3d479")
	if err := enqueue(t, pool, schema, "a", &id); err != nil {
		t.Fatal(err)
	}
	_, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{})
	if !errors.Is(err, outboxmigrate.ErrNotTimeOrdered) || !strings.Contains(err.Error(), id.String()) {
		t.Fatalf("error %v, want ErrNotTimeOrdered naming %s", err, id)
	}
	var kind string
	if err := pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, schema+".outbox_events").Scan(&kind); err != nil || kind != "r" {
		t.Fatalf("relkind %q (%v), want the plain table left", kind, err)
	}
}

// With one partition ahead, a table with events becomes a first partition
// covering their ids up to the end of the interval after the current one,
// followed by partitions one interval wide (at least one, whose width the
// upkeep gives the next ones); it was left the newest, and the upkeep made
// every later partition as wide as it.
func TestPartitionKeptBoundsOneAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := partitionSchema(t)
	old := uuid.Must(uuid.NewV7())
	old[1]-- // 2^32 ms (seven weeks) before now: many intervals wide
	if err := enqueue(t, pool, schema, "a", &old); err != nil {
		t.Fatal(err)
	}
	if err := enqueue(t, pool, schema, "a", nil); err != nil {
		t.Fatal(err)
	}
	const interval = time.Minute
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	res, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{Interval: interval, Ahead: 1})
	if err != nil || res.Kept == "" {
		t.Fatalf("conversion %+v, %v", res, err)
	}
	s, err := pgident.NewSchema(schema)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := partman.List(ctx, pgtx.Pool(pool), s)
	if err != nil || len(parts) < 2 {
		t.Fatalf("partitions %+v, %v: want the kept one and at least one after it", parts, err)
	}
	cur := partman.Align(now, interval)
	kept := parts[0]
	if kept.Name != res.Kept || !kept.From.Equal(partman.Align(partman.TimeOf(old), interval)) {
		t.Fatalf("kept partition %+v, want %s from the interval of the oldest id (%s)", kept, res.Kept, partman.TimeOf(old))
	}
	// The conversion may cross an interval boundary after reading now.
	if end := kept.To; !end.Equal(cur.Add(2*interval)) && !end.Equal(cur.Add(3*interval)) {
		t.Fatalf("kept partition ends at %s, want the end of the interval after the current one (%s)", end, cur.Add(2*interval))
	}
	for _, p := range parts[1:] {
		if p.Interval() != interval {
			t.Fatalf("partition %s is %s wide, want %s", p.Name, p.Interval(), interval)
		}
	}
	if got := partman.Interval(parts); got != interval {
		t.Fatalf("the interval the upkeep makes partitions with is %s, want %s", got, interval)
	}
	made, err := partman.EnsureAhead(ctx, pgtx.Pool(pool), s, now.Add(10*interval), 2)
	if err != nil || len(made) == 0 {
		t.Fatalf("upkeep ten intervals later made %v, %v", made, err)
	}
	parts, err = partman.List(ctx, pgtx.Pool(pool), s)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts[1:] {
		if p.Interval() != interval {
			t.Fatalf("after the upkeep partition %s is %s wide, want %s", p.Name, p.Interval(), interval)
		}
	}
}
