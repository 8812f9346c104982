package outboxmigrate_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// consumerTables are the tables of the consumer side.
var consumerTables = []string{"processed_events", "inbox_aggregates", "inbox_consumers", "side_effects", "side_effect_waits", "outbox_operations"}

// consumerFunctions are the SQL inbox's functions (migration 12) and the
// side_effects trigger's (migration 16).
var consumerFunctions = []string{"inbox_start_point", "inbox_claim", "inbox_seed", "side_effects_resolved_notify"}

// freshSchema is a name for a schema the test creates, dropped at the end.
func freshSchema(t *testing.T, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	s := outboxtest.UniqueName(t, prefix)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+s+" CASCADE") })
	return s
}

// relations returns the schema's tables, sorted.
func relations(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// describeConsumerSide describes the consumer side's objects in schema as
// text: each table's columns, constraints, indexes and storage settings,
// and the SQL inbox functions' definitions, with the schema's name taken
// out, so that two schemas can be compared.
func describeConsumerSide(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	q := func(sql string, args ...any) {
		rows, err := pool.Query(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			b.WriteString(strings.ReplaceAll(l, schema, "S") + "\n")
		}
	}
	for _, table := range consumerTables {
		rel := schema + "." + table
		q(`SELECT 'column ' || attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END
	|| coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '') || CASE WHEN attidentity <> '' THEN ' identity ' || attidentity::text ELSE '' END
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, rel)
		q(`SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) || CASE WHEN convalidated THEN '' ELSE ' (not validated)' END
FROM pg_constraint WHERE conrelid = $1::regclass ORDER BY conname`, rel)
		q(`SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 ORDER BY indexname`, schema, table)
		q(`SELECT 'options ' || coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = $1::regclass`, rel)
		q(`SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal ORDER BY tgname`, rel)
	}
	for _, f := range consumerFunctions {
		q(`SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1 AND p.proname = $2 ORDER BY p.oid::regprocedure::text`, schema, f)
	}
	return b.String()
}

// TestConsumerInstallMatchesTheFullOne installs only the consumer side
// (ComponentsConsumer) in a fresh schema: only the consumer tables exist
// afterwards, an inbox works there, the objects are the same as a full
// install's, a second run does nothing, and a later full Migrate of the
// schema installs the rest and leaves the consumer side as it was.
func TestConsumerInstallMatchesTheFullOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := outboxtest.Pool(t)
	_, full := outboxtest.Schema(t)
	want := describeConsumerSide(t, pool, full)
	if !strings.Contains(want, "inbox_claim") || !strings.Contains(want, "column waiting_since") || !strings.Contains(want, "trigger CREATE TRIGGER side_effects_resolved") {
		t.Fatalf("the full install's description lacks the SQL inbox, migration 4's columns or migration 16's trigger:\n%s", want)
	}

	schema := freshSchema(t, pool, "cons")
	res, err := outboxmigrate.MigrateComponents(ctx, pool, schema, outboxmigrate.ComponentsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	var steps []int
	for _, m := range outboxmigrate.ConsumerMigrations() {
		steps = append(steps, m.Version)
	}
	if !slices.Equal(res.Applied, steps) || !slices.Equal(steps, []int{1, 4, 7, 8, 12, 16}) || res.Current != 16 {
		t.Fatalf("consumer install applied %v, now at %d; want %v, at 16", res.Applied, res.Current, steps)
	}
	wantTables := append(slices.Clone(consumerTables), "outbox_consumer_migrations")
	slices.Sort(wantTables)
	if got := relations(t, pool, schema); !slices.Equal(got, wantTables) {
		t.Fatalf("tables after the consumer install: %v, want only %v", got, wantTables)
	}
	if got := describeConsumerSide(t, pool, schema); got != want {
		t.Fatalf("the consumer install differs from the full one's consumer side:\n--- consumer install\n%s\n--- full install\n%s", got, want)
	}
	if v, err := outboxmigrate.Version(ctx, pool, schema); err != nil || v != 0 {
		t.Fatalf("Version of a consumer-only schema = %d, %v; want 0 (no outbox tables)", v, err)
	}
	res, err = outboxmigrate.MigrateComponents(ctx, pool, schema, outboxmigrate.ComponentsConsumer)
	if err != nil || len(res.Applied) != 0 || res.Current != 16 {
		t.Fatalf("second consumer install: %+v, %v; want nothing applied", res, err)
	}

	// The inbox, through the shared schema value, and the SQL inbox work
	// there.
	in, err := inbox.New(pool, inbox.Config{Consumer: "billing", Tables: outbox.Schema(schema)})
	if err != nil {
		t.Fatal(err)
	}
	m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o1", Sequence: 1, Type: "Placed"}
	if got, err := in.Handle(ctx, m, func(context.Context, pgx.Tx) error { return nil }); err != nil || got != inbox.Applied {
		t.Fatalf("inbox on a consumer-only schema: %v, %v", got, err)
	}
	var claim string
	if err := pool.QueryRow(ctx, `SELECT `+schema+`.inbox_claim('sql_consumer', $1, 'order', 'o1', 1)`, uuid.New()).Scan(&claim); err != nil {
		t.Fatalf("SQL inbox on a consumer-only schema: %v", err)
	}

	// A full migrate later adds the outbox side and keeps the consumer's.
	res, err = outboxmigrate.Migrate(ctx, pool, schema)
	latest := outboxmigrate.All()[len(outboxmigrate.All())-1].Version
	if err != nil || res.Current != latest || len(res.Applied) != len(outboxmigrate.All()) {
		t.Fatalf("full migrate after the consumer install: %+v, %v; want every migration applied", res, err)
	}
	if got := relations(t, pool, schema); !slices.Contains(got, "outbox_events") || !slices.Contains(got, "outbox_relays") {
		t.Fatalf("tables after the full migrate: %v", got)
	}
	if got := describeConsumerSide(t, pool, schema); got != want {
		t.Fatalf("after the full migrate the consumer side differs from a full install's:\n%s\n--- want\n%s", got, want)
	}
	if last, err := in.LastSequence(ctx, "order", "o1"); err != nil || last != 1 {
		t.Fatalf("the consumer's mark after the full migrate: %d, %v; want 1", last, err)
	}
	// And a consumer install on a full schema finds everything there.
	if _, err := outboxmigrate.MigrateComponents(ctx, pool, full, outboxmigrate.ComponentsConsumer); err != nil {
		t.Fatalf("consumer install on a fully migrated schema: %v", err)
	}
	if got := describeConsumerSide(t, pool, full); got != want {
		t.Fatalf("a consumer install changed a full schema's consumer side:\n%s", got)
	}
}

// TestConsumerSQLScript: the printed consumer script (SQLComponents, what
// `outbox migrate --only consumer --print` prints) installs the same
// consumer side, and nothing of the outbox side.
func TestConsumerSQLScript(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := outboxtest.Pool(t)
	_, full := outboxtest.Schema(t)
	schema := freshSchema(t, pool, "consql")
	script, err := outboxmigrate.SQLComponents(schema, outboxmigrate.ComponentsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(script, "CREATE TABLE IF NOT EXISTS outbox_events") {
		t.Fatal("the consumer script creates outbox_events")
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Conn().PgConn().Exec(ctx, script).ReadAll(); err != nil {
		t.Fatalf("run the consumer script: %v", err)
	}
	if got, want := describeConsumerSide(t, pool, schema), describeConsumerSide(t, pool, full); got != want {
		t.Fatalf("the consumer script's schema differs from a full install's consumer side:\n%s\n--- want\n%s", got, want)
	}
	if got := relations(t, pool, schema); slices.Contains(got, "outbox_events") {
		t.Fatalf("tables after the consumer script: %v", got)
	}
	if _, err := outboxmigrate.SQLComponents(schema, "producer"); err == nil || !strings.Contains(fmt.Sprint(err), "consumer") {
		t.Fatalf("unknown components: %v", err)
	}
}
