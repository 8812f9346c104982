package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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

// jitClaims runs a relay, on a pool of its own with JIT on for every
// statement (jit_above_cost 0) and auto_explain reporting each plan as a
// notice, until lanes events are published, and returns how many of the
// relay's claims (the incremental claim's plans) were JIT-compiled, and
// how many it saw.
func jitClaims(t *testing.T, pool *pgxpool.Pool, schema string, lanes int) (jitted, seen int) {
	t.Helper()
	ctx := context.Background()
	cfg := pool.Config().Copy()
	for k, v := range map[string]string{"jit": "on", "jit_above_cost": "0", "session_preload_libraries": "auto_explain",
		"auto_explain.log_min_duration": "0", "auto_explain.log_level": "notice"} {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	var mu sync.Mutex
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if !strings.Contains(n.Message, "WITH fresh AS") {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		seen++
		if strings.Contains(n.Message, "JIT:") {
			jitted++
		}
	}
	own, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	w := newWriter(t, schema)
	rc := quietConfig(schema, discardPublisher{})
	rc.BatchSize = 5
	_, stop := startRelay(t, own, rc)
	writeEvents(t, pool, w, lanes, 1)
	outboxtest.Eventually(t, 30*time.Second, "every event published", func() bool { return unpublished(t, pool, schema) == 0 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	return jitted, seen
}

// A relay on a partitioned outbox runs its statements with JIT off, even
// on a pool that has it on for every statement (a plan over dozens of
// partitions is estimated above jit_above_cost: one claim spent 49 s of
// 51 compiling); on a plain table the pool's setting applies, as before.
func TestPartitionedRelayStatementsRunWithoutJIT(t *testing.T) {
	t.Parallel()
	var available bool
	pool, schema := outboxtest.PartitionedSchema(t, outboxmigrate.PartitionConfig{Interval: time.Hour, Ahead: 6})
	if err := pool.QueryRow(context.Background(), `SELECT pg_jit_available()`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		// Debian's and the official images' PostgreSQL 15 ship llvmjit; a
		// server without it would make this test prove nothing.
		t.Fatal("this server has no JIT (pg_jit_available() is false): the test needs PostgreSQL built with LLVM")
	}
	jitted, seen := jitClaims(t, pool, schema, 12)
	t.Logf("partitioned: %d of %d incremental claims JIT-compiled", jitted, seen)
	if seen == 0 || jitted != 0 {
		t.Errorf("partitioned: %d of %d incremental claims JIT-compiled: want none of at least one", jitted, seen)
	}
	plainPool, plain := outboxtest.Schema(t)
	jitted, seen = jitClaims(t, plainPool, plain, 12)
	t.Logf("plain: %d of %d incremental claims JIT-compiled", jitted, seen)
	if jitted == 0 {
		t.Errorf("plain table: no incremental claim of %d JIT-compiled with jit_above_cost 0: the pool's setting should apply", seen)
	}
}
