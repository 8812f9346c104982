package outboxmigrate_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := outboxtest.Pool(t)
	schema := outboxtest.UniqueName(t, "m")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })

	const n = 4
	var wg sync.WaitGroup
	results := make([]outboxmigrate.Result, n)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i], errs[i] = outboxmigrate.Migrate(ctx, pool, schema)
		}(i)
	}
	wg.Wait()
	applied := 0
	latest := outboxmigrate.All()[len(outboxmigrate.All())-1].Version
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		applied += len(results[i].Applied)
		if results[i].Current != latest {
			t.Fatalf("migrator %d ended at version %d, want %d", i, results[i].Current, latest)
		}
	}
	if applied != len(outboxmigrate.All()) {
		t.Fatalf("%d migrations applied across %d concurrent migrators, want each applied once (%d)", applied, n, len(outboxmigrate.All()))
	}
	v, err := outboxmigrate.Version(ctx, pool, schema)
	if err != nil || v != latest {
		t.Fatalf("Version = %d, %v; want %d", v, err, latest)
	}
	res, err := outboxmigrate.Migrate(ctx, pool, schema)
	if err != nil || len(res.Applied) != 0 {
		t.Fatalf("second Migrate applied %v, err %v", res.Applied, err)
	}
	for _, table := range []string{"outbox_events", "outbox_aggregates", "processed_events", "inbox_aggregates"} {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", schema+"."+table).Scan(&exists); err != nil || !exists {
			t.Errorf("table %s.%s missing (err %v)", schema, table, err)
		}
	}
}

func TestVersionOfMissingSchema(t *testing.T) {
	t.Parallel()
	pool := outboxtest.Pool(t)
	v, err := outboxmigrate.Version(context.Background(), pool, outboxtest.UniqueName(t, "none"))
	if err != nil || v != 0 {
		t.Fatalf("Version = %d, %v; want 0, nil", v, err)
	}
}

func TestInvalidSchemaRefused(t *testing.T) {
	t.Parallel()
	pool := outboxtest.Pool(t)
	for _, bad := range []string{`a"b`, "1abc", "has space", "semi;colon", strings.Repeat("x", 64)} {
		if _, err := outboxmigrate.Migrate(context.Background(), pool, bad); err == nil || !strings.Contains(err.Error(), "invalid schema name") {
			t.Errorf("Migrate(%q) error %v, want invalid schema name", bad, err)
		}
	}
}

func TestPrintedSQLAppliesWithPsqlLikeTools(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := outboxtest.Pool(t)
	schema := outboxtest.UniqueName(t, "p")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	text, err := outboxmigrate.SQL(schema)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// Run twice: the script is idempotent.
	for i := 0; i < 2; i++ {
		if _, err := conn.Conn().PgConn().Exec(ctx, text).ReadAll(); err != nil {
			t.Fatalf("run %d of the printed SQL: %v", i+1, err)
		}
	}
	v, err := outboxmigrate.Version(ctx, pool, schema)
	if err != nil || v != outboxmigrate.All()[len(outboxmigrate.All())-1].Version {
		t.Fatalf("after the printed SQL, Version = %d, %v", v, err)
	}
	// The migrator agrees nothing is left to do.
	res, err := outboxmigrate.Migrate(ctx, pool, schema)
	if err != nil || len(res.Applied) != 0 {
		t.Fatalf("Migrate after printed SQL applied %v, err %v", res.Applied, err)
	}
}
