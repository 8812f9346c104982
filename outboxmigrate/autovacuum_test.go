package outboxmigrate_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// wantStorage is what migration 005 sets on each churning table (see the
// file for why each value).
var wantStorage = map[string]map[string]string{
	"outbox_events": {
		"fillfactor":                            "80",
		"autovacuum_vacuum_scale_factor":        "0.01",
		"autovacuum_vacuum_threshold":           "10000",
		"autovacuum_vacuum_insert_scale_factor": "0.01",
		"autovacuum_vacuum_insert_threshold":    "10000",
		"autovacuum_analyze_scale_factor":       "0.02",
		"autovacuum_analyze_threshold":          "10000",
		"autovacuum_vacuum_cost_limit":          "1000",
	},
	"outbox_aggregates": {
		"fillfactor":                     "70",
		"autovacuum_vacuum_scale_factor": "0.02",
		"autovacuum_vacuum_threshold":    "1000",
	},
	"processed_events": {
		"autovacuum_vacuum_scale_factor":        "0.02",
		"autovacuum_vacuum_threshold":           "10000",
		"autovacuum_vacuum_insert_scale_factor": "0.05",
		"autovacuum_vacuum_insert_threshold":    "10000",
	},
	"inbox_aggregates": {
		"fillfactor":                     "70",
		"autovacuum_vacuum_scale_factor": "0.02",
		"autovacuum_vacuum_threshold":    "1000",
	},
}

// TestAutovacuumStorageParameters migrates a schema that already holds the
// tables of migrations 1–4 with rows in them, and checks that the churning
// tables then carry the storage parameters of migration 005, and that
// setting them rewrote no table (same relfilenode: the ALTER is a catalogue
// change, safe on a live big table).
func TestAutovacuumStorageParameters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := outboxtest.Pool(t)
	schema := outboxtest.UniqueName(t, "av")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })

	// The schema as version 4 left it, applied by hand (the files are
	// idempotent, so Migrate runs them again harmlessly), with a row.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	script.WriteString("BEGIN; CREATE SCHEMA " + schema + "; SET LOCAL search_path TO " + schema + ";\n")
	for _, m := range outboxmigrate.All() {
		if m.Version < 5 {
			script.WriteString(m.SQL + "\n")
		}
	}
	script.WriteString(`INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
VALUES (gen_random_uuid(), 'order', 'o-1', 1, 'OrderCreated', '{}'); COMMIT;`)
	if _, err := conn.Conn().PgConn().Exec(ctx, script.String()).ReadAll(); err != nil {
		conn.Release()
		t.Fatalf("migrations 1-4 by hand: %v", err)
	}
	conn.Release()

	tables := slices.Sorted(maps.Keys(wantStorage))
	fileNodes := func() map[string]uint32 {
		out := map[string]uint32{}
		for _, table := range tables {
			var node uint32
			if err := pool.QueryRow(ctx, "SELECT relfilenode FROM pg_class WHERE oid = $1::regclass", schema+"."+table).Scan(&node); err != nil {
				t.Fatalf("relfilenode of %s: %v", table, err)
			}
			out[table] = node
		}
		return out
	}
	before := fileNodes()

	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	after := fileNodes()
	for _, table := range tables {
		if before[table] != after[table] {
			t.Errorf("%s was rewritten by the migration (relfilenode %d -> %d)", table, before[table], after[table])
		}
		var opts []string
		if err := pool.QueryRow(ctx, "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass", schema+"."+table).Scan(&opts); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, o := range opts {
			k, v, _ := strings.Cut(o, "=")
			got[k] = v
		}
		if !maps.Equal(got, wantStorage[table]) {
			t.Errorf("%s storage parameters = %v, want %v", table, got, wantStorage[table])
		}
	}
}
