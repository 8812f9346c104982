package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// benchHistory drains the same backlog from a table without history and
// from one that also retains e.sz.history published rows, back to back.
func benchHistory(ctx context.Context, e *env) ([]Result, error) {
	n, aggs := e.sz.backlog, e.sz.aggregates
	empty, cleanEmpty, err := e.newSpace(ctx, "history-0")
	if err != nil {
		return nil, err
	}
	defer cleanEmpty()
	full, cleanFull, err := e.newSpace(ctx, "history-full")
	if err != nil {
		return nil, err
	}
	defer cleanFull()
	t := time.Now()
	if err := e.loadBacklog(ctx, full.schema, e.sz.history, 100_000, "h-", 0, true); err != nil {
		return nil, err
	}
	e.logf("history: %d published rows loaded in %s", e.sz.history, time.Since(t).Round(time.Second))
	// Two rounds, in alternating order, each draining a fresh backlog from
	// both tables: what one drain leaves in the caches (shared_buffers is
	// 128 MB here, the table with history 2.5 GB) then favours neither.
	var size string
	elapsed := map[string]time.Duration{}
	for round := 0; round < 2; round++ {
		order := []space{empty, full}
		if round == 1 {
			order = []space{full, empty}
		}
		for _, s := range order {
			if err := e.loadBacklog(ctx, s.schema, n, aggs, fmt.Sprintf("o%d-", round), 1<<40+int64(round)*100_000_000, false); err != nil {
				return nil, err
			}
		}
		if round == 0 {
			_ = e.admin.QueryRow(ctx, "SELECT pg_size_pretty(pg_total_relation_size($1))", full.schema+".outbox_events").Scan(&size)
			if e.o.explainFile != "" {
				if err := e.explainClaim(ctx, full); err != nil {
					return nil, err
				}
			}
		}
		for _, s := range order {
			d, _, err := drainOurs(ctx, e, s, n, nil)
			if err != nil {
				return nil, err
			}
			elapsed[s.schema] += d
			e.logf("history %s round %d: %.0f events/s", s.schema, round+1, float64(n)/d.Seconds())
		}
	}
	rates := []float64{float64(2*n) / elapsed[empty.schema].Seconds(), float64(2*n) / elapsed[full.schema].Seconds()}
	return []Result{
		{Scenario: "history/0-published-rows", EventsPerSec: f(rates[0]), Events: int64(2 * n), Note: "two drains of the backlog, alternating with the table below"},
		{Scenario: fmt.Sprintf("history/%s-published-rows", human(e.sz.history)), EventsPerSec: f(rates[1]), Events: int64(2 * n),
			Ratio: f(rates[1] / rates[0]), RatioOf: "history/0-published-rows", Target: ">= 0.90", Met: b(rates[1]/rates[0] >= 0.9),
			Note: fmt.Sprintf("outbox_events with history and backlog: %s", size)},
	}, nil
}

// explainClaim writes the plan of the relay's claim on the table with
// history (run in a transaction that is rolled back) to the explain file.
func (e *env) explainClaim(ctx context.Context, s space) error {
	pool, err := e.pool(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: s.schema, Publisher: outbox.PublisherFunc(
		func(context.Context, []outbox.Message) []error { return nil }), Logger: quietLogger()})
	if err != nil {
		return err
	}
	plan, err := r.ExplainClaim(ctx)
	if err != nil {
		return err
	}
	if err := os.WriteFile(e.o.explainFile, []byte(plan), 0o644); err != nil {
		return err
	}
	e.logf("claim plan written to %s", e.o.explainFile)
	return nil
}

func human(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// benchIdle runs one `outbox relay` process (default configuration) on an
// empty outbox in a database of its own and counts the transactions that
// database commits (pg_stat_database.xact_commit + xact_rollback): each of
// the relay's statements is one transaction, and nothing else uses that
// database.
func benchIdle(ctx context.Context, e *env) ([]Result, error) {
	db := "outbox_bench_idle_" + e.run
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := e.admin.Exec(c, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			e.logf("drop database %s: %v", db, err)
		}
	}()
	u, err := url.Parse(e.o.databaseURL)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + db
	dbURL := u.String()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	s := space{schema: "outbox", stream: "BENCH_" + e.run + "_IDLE", prefix: "bench_" + e.run + "_idle"}
	_, err = outboxmigrate.Migrate(ctx, conn, s.schema)
	conn.Close(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = e.js.DeleteStream(context.Background(), s.stream) }()
	procs, err := e.startRelays(1, s, dbURL)
	if err != nil {
		stopRelays(procs)
		return nil, err
	}
	defer stopRelays(procs)
	count := func() (int64, error) {
		var n int64
		err := e.admin.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", db).Scan(&n)
		return n, err
	}
	// Let start-up (connect, checks, LISTEN) pass and the counters flush.
	if err := sleepCtx(ctx, e.sz.idleSettle); err != nil {
		return nil, err
	}
	c0, err := count()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := sleepCtx(ctx, e.sz.idleDur); err != nil {
		return nil, err
	}
	c1, err := count()
	if err != nil {
		return nil, err
	}
	qps := float64(c1-c0) / time.Since(t0).Seconds()
	e.logf("idle: %d transactions in %s: %.2f queries/s", c1-c0, time.Since(t0).Round(time.Millisecond), qps)
	return []Result{{Scenario: "idle/relay-queries-per-sec", Value: f(qps), Unit: "queries/s", Seconds: time.Since(t0).Seconds(),
		Target: "<= 2", Met: b(qps <= 2),
		Note: "one `outbox relay` process, empty outbox, own database; pg_stat_database xact_commit+xact_rollback delta"}}, nil
}
