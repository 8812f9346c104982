package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// relayPlans runs a relay on a pool of its own until lanes×rounds events,
// written in rounds while it runs, are published (batches of 5: several
// incremental claims, marks), stops it, and returns, for each of its
// statements on outbox_events, the generic and custom plans its
// connections made (pg_prepared_statements, summed over them).
func relayPlans(t *testing.T, pool *pgxpool.Pool, schema string, lanes, rounds int) map[string][2]int64 {
	t.Helper()
	ctx := context.Background()
	own, err := pgxpool.NewWithConfig(ctx, pool.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	w := newWriter(t, schema)
	cfg := quietConfig(schema, discardPublisher{})
	cfg.BatchSize = 5
	r, stop := startRelay(t, own, cfg)
	for range rounds {
		writeEvents(t, pool, w, lanes, 1)
		outboxtest.Eventually(t, 30*time.Second, "every event published", func() bool { return unpublished(t, pool, schema) == 0 })
	}
	stop()
	names := map[string]string{}
	for name, sql := range outbox.RelayStatements(ctx, r) {
		names[sql] = name
	}
	plans := map[string][2]int64{}
	for _, c := range own.AcquireAllIdle(ctx) {
		rows, err := c.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var sql string
			var generic, custom int64
			if err := rows.Scan(&sql, &generic, &custom); err != nil {
				t.Fatal(err)
			}
			if name, ok := names[sql]; ok {
				p := plans[name]
				plans[name] = [2]int64{p[0] + generic, p[1] + custom}
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		c.Release()
	}
	return plans
}

// On a partitioned outbox the relay's statements on outbox_events are
// planned once per connection (generic plans, plan_cache_mode
// force_generic_plan for their own transaction) instead of for each run:
// PostgreSQL never found a generic plan of the incremental claim cheaper
// than a custom one, and planned it at every claim, which cost more than
// running it (BENCHMARKS.md, "The partitioned claim's planning"). On a
// plain table the relay's statements are planned as before (custom plans
// first).
func TestPartitionedRelayStatementsUseGenericPlans(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.PartitionedSchema(t, outboxmigrate.PartitionConfig{Interval: time.Hour, Ahead: 6})
	plans := relayPlans(t, pool, schema, 12, 4)
	t.Logf("partitioned: generic, custom plans: %v", plans)
	for name, p := range plans {
		if p[1] != 0 {
			t.Errorf("%s: %d custom plans (and %d generic): want generic plans only", name, p[1], p[0])
		}
	}
	for _, name := range []string{"fastClaim", "markPublished"} {
		if plans[name][0] < 2 {
			t.Errorf("%s ran with %d generic plans: want at least 2 (was it run?)", name, plans[name][0])
		}
	}

	plainPool, plain := outboxtest.Schema(t)
	plans = relayPlans(t, plainPool, plain, 12, 4)
	t.Logf("plain: generic, custom plans: %v", plans)
	if plans["fastClaim"][1] == 0 {
		t.Errorf("plain table: the incremental claim made no custom plan (%v): its statements should be planned as before", plans["fastClaim"])
	}
}
