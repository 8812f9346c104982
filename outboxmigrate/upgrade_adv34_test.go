package outboxmigrate_test

// Migration 014 against schemas and indexes an operator may have: tests
// written by the adv34 adversarial review, each failing on the code it
// reviewed.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestAdv34MigrateMixedCaseSchema: schema names may hold upper-case letters
// (pgident: letters, digits, underscores; quoted everywhere), and migrations
// 001 to 013 apply to such a schema. Migration 014's DO block compares
// relnamespace with current_schema()::regnamespace: the cast parses the name
// as an unquoted identifier and folds it to lower case, so on schema
// "Adv34_..." it looks up "adv34_..." and the migration fails (3F000), on a
// new deployment as on an upgrade.
func TestAdv34MigrateMixedCaseSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := outboxtest.Pool(t)
	schema := "Adv34_" + outboxtest.UniqueName(t, "m")
	if len(schema) > 63 {
		schema = schema[:63]
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("migrate schema %q: %v", schema, err)
	}
}

// TestAdv34UpgradeTo014RebuildsAnIndexWithAnotherPredicate: migration 014
// (and docs/operations.md, "Upgrading to migration 14") says an index named
// outbox_fresh_key_idx "with another definition" is dropped and built again.
// Its check is a LIKE on the definition's first predicate term only: an
// index with the right columns and first term but a further condition is
// kept, and the relay's statements, which do not state that condition,
// cannot use it (the range scan of every incremental claim is then a scan
// of the table).
func TestAdv34UpgradeTo014RebuildsAnIndexWithAnotherPredicate(t *testing.T) {
	t.Parallel()
	ctx, pool, schema := schemaAt(t, 13)
	if _, err := pool.Exec(ctx, `CREATE INDEX outbox_fresh_key_idx ON `+schema+`.outbox_events (dispatch_xid, event_id)
		WHERE coalesce(published_at, quarantined_at) IS NULL AND dispatch_xid IS NOT NULL
		  AND available_at = occurred_at AND attempt_count = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	var def string
	if err := pool.QueryRow(ctx, `SELECT pg_get_indexdef(($1 || '.outbox_fresh_key_idx')::regclass)`, schema).Scan(&def); err != nil {
		t.Fatal(err)
	}
	const want = `(dispatch_xid, event_id) WHERE ((COALESCE(published_at, quarantined_at) IS NULL) AND (dispatch_xid IS NOT NULL) AND (available_at = occurred_at))`
	if !strings.HasSuffix(def, want) {
		t.Fatalf("after migration 014 the index is\n  %s\nwant one ending in\n  %s", def, want)
	}
}
