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
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

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
// 32 partitions of a minute (15 settled, 15 made ahead; 1000 lanes, batch
// 1000), eight runs in a row of the statement prepared on one connection
// (each in a transaction it rolls back, JIT off), with plan_cache_mode
// force_custom_plan (a plan at each run, as PostgreSQL's auto mode did for
// these statements) on one connection and force_generic_plan (one plan,
// kept: what the relay now sets) on another, run by turns: each run's
// whole time and its execution's alone (auto_explain, its duration sent
// back as a notice), the difference being mostly planning; and how many
// plans of each kind each connection made (pg_prepared_statements).
// BENCHMARKS.md, "The partitioned claim's planning".
func TestPartitionedClaimFiguresPlanCache(t *testing.T) {
	pool, schema := partitionedLanes(t, 15, 15, 1000, 3)
	planCacheFigures(t, pool, schema)
}

// TestPlainClaimFiguresPlanCache is TestPartitionedClaimFiguresPlanCache
// on a plain table (1000 lanes, one published event and three pending
// each): whether planning once would help there too.
func TestPlainClaimFiguresPlanCache(t *testing.T) {
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	writeEvents(t, pool, w, 1000, 1)
	if _, err := pool.Exec(context.Background(), `UPDATE `+schema+`.outbox_events SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	writeEvents(t, pool, w, 1000, 3)
	if _, err := pool.Exec(context.Background(), `ANALYZE `+schema+`.outbox_events`); err != nil {
		t.Fatal(err)
	}
	planCacheFigures(t, pool, schema)
}

func planCacheFigures(t *testing.T, pool *pgxpool.Pool, schema string) {
	ctx := context.Background()
	cfg := quietConfig(schema, discardPublisher{})
	cfg.BatchSize = 1000
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	durRe := regexp.MustCompile(`^duration: ([0-9.]+) ms`)
	connect := func(last *float64) *pgx.Conn {
		cc := pool.Config().ConnConfig.Copy()
		cc.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			if m := durRe.FindStringSubmatch(n.Message); m != nil {
				*last, _ = strconv.ParseFloat(m[1], 64)
			}
		}
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		for _, set := range []string{`SET jit = off`, `LOAD 'auto_explain'`, `SET auto_explain.log_level = notice`,
			`SET auto_explain.log_min_duration = 0`, `SET auto_explain.log_analyze = on`, `SET auto_explain.log_timing = off`} {
			if _, err := conn.Exec(ctx, set); err != nil {
				t.Fatal(err)
			}
		}
		return conn
	}
	modes := []string{"force_custom_plan", "force_generic_plan"}
	for _, which := range []string{"claim", "fresh", "look"} {
		sql, args, err := outbox.ClaimStatementOf(ctx, r, which, false)
		if err != nil {
			t.Fatal(err)
		}
		var last [2]float64
		conns := [2]*pgx.Conn{connect(&last[0]), connect(&last[1])}
		var whole, exec, cpu [2][]time.Duration
		for range 8 {
			for k, conn := range conns {
				before := backendCPU(t, conn)
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, modes[k]); err != nil {
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
				whole[k] = append(whole[k], time.Since(start).Round(time.Millisecond))
				// A SELECT's executor ends (and auto_explain reports) when
				// its portal is dropped: by the rollback at the latest.
				_ = tx.Rollback(ctx)
				exec[k] = append(exec[k], time.Duration(last[k]*float64(time.Millisecond)).Round(time.Millisecond))
				cpu[k] = append(cpu[k], backendCPU(t, conn)-before)
			}
		}
		for k, conn := range conns {
			var generic, custom int64
			if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`, sql).Scan(&generic, &custom); err != nil {
				t.Fatal(err)
			}
			t.Logf("%-5s %-18s whole %v execution %v backend CPU %v: %d generic plans, %d custom", which, modes[k], whole[k], exec[k], cpu[k], generic, custom)
			_ = conn.Close(ctx)
		}
	}
}

// backendCPU is the CPU time conn's backend has used (user and system,
// from /proc: the database runs on this machine), in clock ticks of 10 ms.
func backendCPU(t *testing.T, conn *pgx.Conn) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(conn.PgConn().PID())) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// TestPartitionedClaimFiguresPlanCacheUnanalyzed is
// TestPartitionedClaimFiguresPlanCache at the sizing bench's shape, whose
// partitions are never analyzed (TestPartitionedClaimFiguresBatch1000's:
// 10 s partitions, 30 ahead, 1000 lanes of one published and two pending
// events).
func TestPartitionedClaimFiguresPlanCacheUnanalyzed(t *testing.T) {
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, outboxmigrate.PartitionConfig{Interval: 10 * time.Second, Ahead: 30})
	w := newWriter(t, schema)
	writeEvents(t, pool, w, 1000, 1)
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	writeEvents(t, pool, w, 1000, 2)
	planCacheFigures(t, pool, schema)
}
