package sideeffect_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/sideeffect"
)

// TestAdv22bWaitsPageReadsAPageNotTheTable: Admin.Waits says it reads the
// primary key's order, "so a page costs the same however many events
// wait". Its ORDER BY event_id names the output column event_id (the
// select list's event_id::text), not the table's uuid, so PostgreSQL
// cannot read the key in order: every page scans and sorts every waiting
// event of the schema. Counted here in the table's statistics: reading
// two pages of 10 out of 5,000 waits reads far more than 5,000 rows.
func TestAdv22bWaitsPageReadsAPageNotTheTable(t *testing.T) {
	b := setup(t, sideeffect.Neither)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.side_effect_waits (consumer_name, event_id, name, key, aggregate_type, aggregate_id,
	sequence, event_type, schema_version, content_type, payload)
SELECT 'payments', gen_random_uuid(), 'payments.charge', 'k' || i, 'order', 'ord-' || i, 1, 'OrderPlaced', 1, 'application/json', '\x7b7d'
FROM generate_series(1, 5000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE `+b.schema+`.side_effect_waits`); err != nil {
		t.Fatal(err)
	}
	// One connection, so that its statistics are flushed on demand
	// (pg_stat_force_next_flush, then idle) and read back in order.
	cfg := b.pool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: b.schema})
	if err != nil {
		t.Fatal(err)
	}
	read := func() int64 {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables
WHERE relid = $1::regclass`, b.schema+".side_effect_waits").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := read()
	page, err := admin.Waits(ctx, sideeffect.WaitsFilter{Limit: 10})
	if err != nil || page.Next == nil {
		t.Fatalf("first page: %+v, %v", page, err)
	}
	if page, err = admin.Waits(ctx, sideeffect.WaitsFilter{Limit: 10, After: page.Next}); err != nil || len(page.Waits) != 10 {
		t.Fatalf("second page: %+v, %v", page, err)
	}
	if n := read() - before; n > 1000 {
		t.Fatalf("two pages of 10 of 5,000 waiting events read %d rows; want about 22 (the primary key in order)", n)
	}
}

// TestAdv22bWaitsPagesEveryEventOnce: paging Admin.Waits with its cursor
// over consumers whose names differ in case and length, with and without
// a Name filter, lists every waiting event exactly once (the order is the
// database collation's, so it is not checked here).
func TestAdv22bWaitsPagesEveryEventOnce(t *testing.T) {
	b := setup(t, sideeffect.Neither)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+b.schema+`.side_effect_waits (consumer_name, event_id, name, key, aggregate_type, aggregate_id,
	sequence, event_type, schema_version, content_type, payload)
SELECT c, gen_random_uuid(), CASE WHEN i % 3 = 0 THEN 'a' ELSE 'b' END, 'k' || i, 'order', 'ord-' || i, 1, 'OrderPlaced', 1, 'application/json', '\x7b7d'
FROM unnest(ARRAY['B', 'a', 'aa', 'a-b', 'é']) c, generate_series(1, 23) i`); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "a", "b"} {
		var want int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.schema+`.side_effect_waits WHERE $1 = '' OR name = $1`, name).Scan(&want); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		f := sideeffect.WaitsFilter{Name: name, Limit: 7}
		for pages := 0; ; pages++ {
			if pages > 100 {
				t.Fatalf("name %q: paging does not end", name)
			}
			page, err := b.admin.Waits(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range page.Waits {
				if seen[w.Consumer+"/"+w.EventID] {
					t.Fatalf("name %q: %s/%s listed twice", name, w.Consumer, w.EventID)
				}
				seen[w.Consumer+"/"+w.EventID] = true
				if name != "" && w.Name != name {
					t.Fatalf("name %q: listed a wait on %q", name, w.Name)
				}
			}
			if page.Next == nil {
				break
			}
			f.After = page.Next
		}
		if len(seen) != want {
			t.Fatalf("name %q: paged through %d waits of %d", name, len(seen), want)
		}
	}
}
