package outboxmigrate_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestVersionsReadsManySchemasAtOnce: Versions gives each schema's version,
// and a schema without the migrations table reads as 0 (the statement
// falls back to one query per schema).
func TestVersionsReadsManySchemasAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, a := outboxtest.Schema(t)
	_, b := outboxtest.Schema(t)
	all := outboxmigrate.All()
	latest := all[len(all)-1].Version
	got, err := outboxmigrate.Versions(ctx, pool, []string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if got[a] != latest || got[b] != latest {
		t.Fatalf("versions %v: want %d for both", got, latest)
	}
	empty := outboxtest.UniqueName(t, "e")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+empty); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+empty+" CASCADE") })
	got, err = outboxmigrate.Versions(ctx, pool, []string{a, empty})
	if err != nil {
		t.Fatal(err)
	}
	if got[a] != latest || got[empty] != 0 {
		t.Fatalf("versions %v: want %d for %s and 0 for the schema without tables", got, latest, a)
	}
}
