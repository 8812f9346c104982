package outboxmigrate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// migrateThrough applies the migrations up to version last to schema, as
// Migrate does (one transaction each, the schema first on search_path, the
// version recorded): a database an older release migrated.
func migrateThrough(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, last int) {
	t.Helper()
	migrateFrom(t, ctx, pool, schema, 1, last)
}

// schemaAt returns a context for the test (60 s), the test database and a
// new schema migrated through migration last, dropped at the test's end.
func schemaAt(t *testing.T, last int) (context.Context, *pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	pool := outboxtest.Pool(t)
	schema := outboxtest.UniqueName(t, "u")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	migrateThrough(t, ctx, pool, schema, last)
	return ctx, pool, schema
}

// migrateFrom is migrateThrough for the migrations first to last only, on a
// schema at first-1.
func migrateFrom(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, first, last int) {
	t.Helper()
	for _, m := range outboxmigrate.All() {
		if m.Version < first {
			continue
		}
		if m.Version > last {
			break
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, q := range []string{
				"CREATE SCHEMA IF NOT EXISTS " + schema,
				"SET LOCAL search_path TO " + schema,
				`CREATE TABLE IF NOT EXISTS outbox_schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
					applied_at timestamptz NOT NULL DEFAULT now())`,
				m.SQL,
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO outbox_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
	}
}

// TestAdv2UpgradeTo013KeepsThePayloadLimit: a database at 012 whose owner
// raised the payload limit as docs/sql-api.md says (ALTER FUNCTION enqueue
// bytea and enqueue_many SET outbox.max_payload_bytes) and whose writer role
// has the printed grants, with events written. Migration 013 keeps the
// events and the writer's EXECUTE (CREATE OR REPLACE keeps grants), but
// CREATE OR REPLACE also replaces each function's SET clauses: the limit is
// back at 1 MiB, and the Go writer configured with MaxPayloadBytes 4 MiB
// (which passes the payload to enqueue) now has its caller's transaction
// aborted by the database for a 2 MiB event it accepted at 012. Nothing in
// 013's header or the CHANGELOG says so. Fix: 013 (and every later
// migration that replaces a write function) carries the current value
// over, e.g. read current_setting from the old function's proconfig
// (pg_proc.proconfig) before CREATE OR REPLACE and re-apply it with ALTER
// FUNCTION after; or keep the limit outside the function definitions (a
// settings row); and say so under "Upgrading".
func TestAdv2UpgradeTo013KeepsThePayloadLimit(t *testing.T) {
	t.Parallel()
	ctx, pool, schema := schemaAt(t, 12)

	writerRole := outboxtest.UniqueName(t, "w")
	if _, err := pool.Exec(ctx, "CREATE ROLE "+writerRole+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = pool.Exec(ctx, "DROP OWNED BY "+writerRole)
		_, _ = pool.Exec(ctx, "DROP ROLE "+writerRole)
	})
	script, err := outboxmigrate.Grants(schema, outboxmigrate.Roles{Writer: writerRole,
		Relay: writerRole + "_r", Operator: writerRole + "_o", Consumer: writerRole + "_c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"_r", "_o", "_c"} {
		if _, err := pool.Exec(ctx, "CREATE ROLE "+writerRole+r+" NOLOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			_, _ = pool.Exec(ctx, "DROP OWNED BY "+writerRole+r)
			_, _ = pool.Exec(ctx, "DROP ROLE "+writerRole+r)
		})
	}
	// The printed grants are for a schema at this version's migration;
	// the lines about a table of a later migration than 012
	// (side_effect_waits, 016) are left out here.
	var lines []string
	for _, line := range strings.Split(script, "\n") {
		if !strings.Contains(line, "side_effect_waits") {
			lines = append(lines, line)
		}
	}
	if _, err := pool.Exec(ctx, strings.Join(lines, "\n")); err != nil {
		t.Fatalf("grants: %v", err)
	}
	for _, fn := range []string{"enqueue(text, text, text, bytea, text, jsonb, text, integer, uuid)", "enqueue_many(jsonb)"} {
		if _, err := pool.Exec(ctx, `ALTER FUNCTION `+schema+`.`+fn+` SET outbox.max_payload_bytes = '4194304'`); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = writerRole
	writerDB, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer writerDB.Close()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, MaxPayloadBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(`"` + strings.Repeat("x", 2<<20) + `"`)
	write := func(id string) error {
		return pgx.BeginFunc(ctx, writerDB, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "Placed", Payload: big})
			return err
		})
	}
	if err := write("at-012"); err != nil {
		t.Fatalf("at 012, a 2 MiB event under the raised 4 MiB limit: %v", err)
	}
	var before string
	if err := pool.QueryRow(ctx, `SELECT string_agg(md5(to_jsonb(e)::text), ',' ORDER BY event_id) FROM `+schema+`.outbox_events e`).Scan(&before); err != nil {
		t.Fatal(err)
	}

	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}

	var after string
	if err := pool.QueryRow(ctx, `SELECT string_agg(md5(to_jsonb(e)::text), ',' ORDER BY event_id) FROM `+schema+`.outbox_events e`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("013 changed the events written at 012")
	}
	if err := pgx.BeginFunc(ctx, writerDB, func(tx pgx.Tx) error {
		_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "small", Type: "Placed", Payload: []byte(`{}`)})
		return err
	}); err != nil {
		t.Errorf("after 013 the writer role cannot write (grants lost?): %v", err)
	}
	if err := write("at-013"); err != nil {
		t.Errorf("the owner raised the payload limit to 4 MiB at 012; after migration 013 a 2 MiB event is refused: %v", err)
	}
	// The text form called the bytea form at 012, whose limit applied; at
	// 013 it has its own, which the migration sets to the bytea form's.
	if err := pgx.BeginFunc(ctx, writerDB, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT * FROM `+schema+`.enqueue('order', 'big-text', 'Placed', $1::text)`, string(big))
		return err
	}); err != nil {
		t.Errorf("after 013, a 2 MiB text payload under the limit raised at 012: %v", err)
	}
}

// TestUpgradeTo014RebuildsAnInvalidIndex: an operator followed
// operations.md ("Upgrading to migration 14") and created
// outbox_fresh_key_idx concurrently before migrating, but the build failed
// and left an invalid index of that name. Migration 014 must not keep it
// (CREATE INDEX IF NOT EXISTS would, and drop the old index: no index for
// the incremental claim at all): it builds it again.
func TestUpgradeTo014RebuildsAnInvalidIndex(t *testing.T) {
	t.Parallel()
	ctx, pool, schema := schemaAt(t, 13)
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes)
		SELECT gen_random_uuid(), 'order', 'o' || g, 1, 'Tick', '{}' FROM generate_series(1, 2) g`); err != nil {
		t.Fatal(err)
	}
	// A unique index on a column with a repeated value fails, as a
	// cancelled build does, after its entry in pg_index was made.
	if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY outbox_fresh_key_idx ON `+schema+`.outbox_events (aggregate_type)`); err == nil {
		t.Fatal("the failing concurrent build succeeded")
	}
	valid := func() (exists, ok bool) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_and(i.indisvalid), false) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			WHERE c.relname = 'outbox_fresh_key_idx' AND c.relnamespace = $1::regnamespace`, schema).Scan(&exists, &ok)
		if err != nil {
			t.Fatal(err)
		}
		return exists, ok
	}
	if exists, ok := valid(); !exists || ok {
		t.Fatalf("before the migration: index exists %v, valid %v; want an invalid one", exists, ok)
	}
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if exists, ok := valid(); !exists || !ok {
		t.Fatalf("after migration 014: index exists %v, valid %v; want a valid one", exists, ok)
	}
	var def string
	if err := pool.QueryRow(ctx, `SELECT pg_get_indexdef(($1 || '.outbox_fresh_key_idx')::regclass)`, schema).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(def, "(dispatch_xid, event_id)") {
		t.Fatalf("after migration 014: %s", def)
	}
}
