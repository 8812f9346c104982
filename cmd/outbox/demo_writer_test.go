package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestDemoSQLWriter runs "outbox demo --writer sql": the order API records
// its events by plain SQL calls of enqueue, and every invariant holds, with
// the saga. Which code wrote the order events is read from PostgreSQL's
// function statistics (track_functions=all on the demo's connections):
// the SQL writer passes the payload as text, which picks enqueue's text
// form, and outbox.Writer never calls that form (it binds bytea, or calls
// enqueue_many). So with --writer sql the text form was called at least
// once per order event, and with --writer go (the contrast, a short run
// without the saga) it was never called while the Go writer's forms were
// called once per event at least.
func TestDemoSQLWriter(t *testing.T) {
	url := outboxtest.DatabaseURL()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	// Superuser-only: the tests' role is the server's superuser.
	url += sep + "track_functions=all"
	pool := outboxtest.Pool(t)
	run := func(t *testing.T, args ...string) (report, schema string) {
		t.Helper()
		report, schema, _ = runDemoTest(t, append([]string{"--database-url", url, "--keep"}, args...)...)
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		})
		return report, schema
	}

	t.Run("sql", func(t *testing.T) {
		report, schema := run(t, "--orders", "60", "--destination", "", "--writer", "sql")
		if !strings.Contains(report, "order API writes events with: plain SQL") {
			t.Error("the report does not say the order API writes events in plain SQL")
		}
		checkSagaReport(t, report, "idempotent")
		orderEvents := countEvents(t, schema, orderevents.AggregateType)
		if orderEvents == 0 {
			t.Fatal("the order API wrote no event")
		}
		c := waitCalls(t, schema, "the text form called once per order event", func(c enqueueCalls) bool { return c.text >= orderEvents })
		t.Logf("%d order events; enqueue calls: text form %d, bytea form %d (the text form's included), enqueue_many %d",
			orderEvents, c.text, c.bytea, c.many)
	})

	t.Run("go", func(t *testing.T) {
		_, schema := run(t, "--orders", "20", "--destination", "", "--no-saga")
		events := countEvents(t, schema, "")
		c := waitCalls(t, schema, "the Go writer's forms called once per event", func(c enqueueCalls) bool { return c.bytea+c.many >= events })
		if c.text != 0 {
			t.Errorf("--writer go: the text form of enqueue was called %d times: it no longer tells the SQL writer's rows from outbox.Writer's", c.text)
		}
	})
}

// enqueueCalls are the calls of a schema's write functions PostgreSQL
// counted: enqueue with a text payload, with a bytea payload (the text
// form calls it, so its calls are included), and enqueue_many.
type enqueueCalls struct{ text, bytea, many int64 }

// waitCalls waits until the function statistics of schema satisfy done
// (what, if they never do). A backend reports its counts when idle, at
// most once a second, and on exit: the demo's connections closed when it
// returned, their counts arrive shortly after.
func waitCalls(t *testing.T, schema, what string, done func(enqueueCalls) bool) enqueueCalls {
	t.Helper()
	pool := outboxtest.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var c enqueueCalls
		err := pool.QueryRow(ctx, `SELECT
	coalesce(sum(s.calls) FILTER (WHERE p.proname = 'enqueue' AND p.proargtypes[3] = 'text'::regtype), 0),
	coalesce(sum(s.calls) FILTER (WHERE p.proname = 'enqueue' AND p.proargtypes[3] = 'bytea'::regtype), 0),
	coalesce(sum(s.calls) FILTER (WHERE p.proname = 'enqueue_many'), 0)
FROM pg_stat_user_functions s JOIN pg_proc p ON p.oid = s.funcid
WHERE s.schemaname = $1`, schema).Scan(&c.text, &c.bytea, &c.many)
		if err != nil {
			t.Fatalf("function statistics: %v", err)
		}
		if done(c) {
			return c
		}
		select {
		case <-ctx.Done():
			t.Fatalf("function statistics of %s: want %s, have %+v (is track_functions settable by the tests' role?)", schema, what, c)
		case <-tick.C:
		}
	}
}

// countEvents counts the events of aggregateType in schema (all when "").
func countEvents(t *testing.T, schema, aggregateType string) int64 {
	t.Helper()
	var n int64
	if err := outboxtest.Pool(t).QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, "outbox_events"}.Sanitize()+`
WHERE $1 = '' OR aggregate_type = $1`, aggregateType).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
