//go:build partitionfigures

package outbox_test

// The partitioned claim's figures (BENCHMARKS.md, "The partitioned claim's
// lane lookups" and "The partitioned claim's time, measured"):
//
//	go test -tags partitionfigures -count=1 -v -run '^TestPartitionedClaimFigures' .
//
// They print buffers, planning and execution times and assert nothing the
// suite needs: a benchmark, built only with the partitionfigures tag, never
// a test the suite skips.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestPartitionedClaimFigures prints the claim statements' buffers and
// times with 4, 12 and 30 partitions, for BENCHMARKS.md.
func TestPartitionedClaimFigures(t *testing.T) {
	for _, n := range []int{4, 12, 30} {
		old := (n - 2) / 2
		ahead := n - 2 - old
		pool, schema := partitionedLanes(t, old, ahead, 300, 3)
		for _, raw := range []bool{true, false} {
			costs := claimCosts(t, pool, schema, raw)
			for _, which := range []string{"claim", "fresh", "look"} {
				c := costs[which]
				t.Logf("partitions %2d  plain statements %-5v  %-5s  buffers %7d  planning %8s  execution %8s", n, raw, which, c.Buffers, c.Planning, c.Run)
			}
		}
	}
}

// TestPartitionedClaimFiguresBatch1000 prints, with
// the claim statements' buffers, planning and
// execution at the sizing bench's shape (batch 1000, partitions of 10 s,
// 30 made ahead, 1000 lanes with one published and two pending events
// each), before and after ANALYZE, plain statements against the near
// lookups: the sizing bench's private cluster runs with autovacuum off, so
// its partitions are never analyzed, and partitions made ahead are empty
// until they are current in any cluster (BENCHMARKS.md, "The partitioned
// claim's time, measured").
func TestPartitionedClaimFiguresBatch1000(t *testing.T) {
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, outboxmigrate.PartitionConfig{Interval: 10 * time.Second, Ahead: 30})
	w := newWriter(t, schema)
	writeEvents(t, pool, w, 1000, 1)
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	writeEvents(t, pool, w, 1000, 2)
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			if _, err := pool.Exec(ctx, `ANALYZE `+schema+`.outbox_events`); err != nil {
				t.Fatal(err)
			}
		}
		for _, raw := range []bool{true, false} {
			cfg := quietConfig(schema, discardPublisher{})
			cfg.BatchSize = 1000
			r, err := outbox.NewRelay(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, which := range []string{"claim", "fresh", "look"} {
				for i := range 2 {
					c, err := outbox.ClaimCostOf(ctx, r, which, raw)
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("analyzed %-5v plain statements %-5v %-5s run %d: buffers %7d planning %10s execution %10s", analyzed, raw, which, i, c.Buffers, c.Planning, c.Run)
				}
			}
		}
	}
}

// TestPartitionedClaimFiguresQuietLanes prints the claim statements'
// buffers with 4 and 30 partitions when each
// head's predecessor was written minutes before it (an aggregate whose
// events are minutes apart, as an order's are): the near lookup misses and
// the check of every partition decides, as with the plain statements.
func TestPartitionedClaimFiguresQuietLanes(t *testing.T) {
	for _, n := range []int{4, 30} {
		old := (n - 2) / 2
		pool, schema := partitionedQuietLanes(t, old, n-2-old, 300, 3)
		for _, raw := range []bool{true, false} {
			costs := claimCosts(t, pool, schema, raw)
			for _, which := range []string{"claim", "fresh"} {
				c := costs[which]
				t.Logf("quiet lanes  partitions %2d  plain statements %-5v  %-5s  buffers %7d  execution %8s", n, raw, which, c.Buffers, c.Run)
			}
		}
	}
}

// TestPartitionedClaimFiguresPlanCache prints, for each claim statement on
// 32 partitions of a minute (15 settled, 15 made ahead), the time of eight
// runs in a row of the statement prepared on one connection (each in a
// transaction it rolls back), with plan_cache_mode auto (PostgreSQL plans
// a custom plan for each of the first five runs, then chooses) and
// force_generic_plan (one plan, kept), and how many plans of each kind the
// connection made (pg_prepared_statements); then one run of each under
// EXPLAIN (ANALYZE) for its planning and execution apart (BENCHMARKS.md,
// "The partitioned claim's planning").
func TestPartitionedClaimFiguresPlanCache(t *testing.T) {
	ctx := context.Background()
	pool, schema := partitionedLanes(t, 15, 15, 1000, 3)
	cfg := quietConfig(schema, discardPublisher{})
	cfg.BatchSize = 1000
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, which := range []string{"claim", "fresh", "look"} {
		for range 2 {
			c, err := outbox.ClaimCostOf(ctx, r, which, false)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%-5s EXPLAIN ANALYZE (custom plan): buffers %7d planning %10s execution %10s", which, c.Buffers, c.Planning, c.Run)
		}
	}
	for _, mode := range []string{"auto", "force_generic_plan"} {
		for _, which := range []string{"claim", "fresh", "look"} {
			sql, args, err := outbox.ClaimStatementOf(ctx, r, which, false)
			if err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `SET jit = off`); err != nil {
				t.Fatal(err)
			}
			var runs []time.Duration
			for range 8 {
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				rows, err := tx.Query(ctx, sql, args...)
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				runs = append(runs, time.Since(start).Round(100*time.Microsecond))
				_ = tx.Rollback(ctx)
			}
			var generic, custom int64
			if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`, sql).Scan(&generic, &custom); err != nil {
				t.Fatal(err)
			}
			t.Logf("%-5s plan_cache_mode %-18s runs %v: %d generic plans, %d custom", which, mode, runs, generic, custom)
			_ = conn.Close(ctx)
		}
	}
}
