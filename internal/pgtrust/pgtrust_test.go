package pgtrust_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgtrust"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestCheck: a migrated schema passes; a trigger on a trusted table whose
// function a tenant owns (the tenant given the TRIGGER privilege), a table
// owned by the tenant, a view in place of a table and a schema owned by the
// tenant are each refused naming the object and its owner, unless the
// tenant is listed among the trusted owners; a missing schema is an error.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	tenant := outboxtest.UniqueName(t, "tenant")
	exec := func(qs ...string) {
		t.Helper()
		for _, q := range qs {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	exec("CREATE ROLE " + tenant + " NOLOGIN NOSUPERUSER")
	t.Cleanup(func() {
		for _, q := range []string{"REASSIGN OWNED BY " + tenant + " TO CURRENT_USER", "DROP OWNED BY " + tenant, "DROP ROLE " + tenant} {
			if _, err := pool.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	var me string
	if err := pool.QueryRow(ctx, "SELECT current_user").Scan(&me); err != nil {
		t.Fatal(err)
	}
	refused := func(what string, trusted []string, object, owner string) {
		t.Helper()
		err := pgtrust.Check(ctx, pool, schema, trusted)
		var u *pgtrust.Untrusted
		if !errors.As(err, &u) || !strings.Contains(u.Object, object) || (owner != "" && u.Owner != owner) {
			t.Errorf("%s: %v; want untrusted %s (owner %q)", what, err, object, owner)
		}
	}
	if err := pgtrust.Check(ctx, pool, schema, nil); err != nil {
		t.Fatalf("a migrated schema: %v", err)
	}

	exec("GRANT USAGE ON SCHEMA "+schema+" TO "+tenant, "GRANT TRIGGER ON "+schema+".outbox_operations TO "+tenant,
		"CREATE FUNCTION public."+tenant+"_hook() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
		"ALTER FUNCTION public."+tenant+"_hook() OWNER TO "+tenant,
		"CREATE TRIGGER "+tenant+"_hook AFTER INSERT ON "+schema+".outbox_operations FOR EACH ROW EXECUTE FUNCTION public."+tenant+"_hook()")
	refused("a tenant's trigger function", nil, "trigger "+tenant+"_hook", tenant)
	if err := pgtrust.Check(ctx, pool, schema, []string{me, tenant}); err != nil {
		t.Errorf("the tenant trusted: %v", err)
	}
	exec("DROP TRIGGER " + tenant + "_hook ON " + schema + ".outbox_operations")

	exec("ALTER TABLE " + schema + ".outbox_aggregates OWNER TO " + tenant)
	refused("a tenant's table", nil, "outbox_aggregates", tenant)
	refused("a tenant's table, another role trusted", []string{me}, "outbox_aggregates", tenant)
	exec("ALTER TABLE " + schema + ".outbox_aggregates OWNER TO CURRENT_USER")

	exec("ALTER TABLE "+schema+".outbox_relays RENAME TO outbox_relays_t",
		"CREATE VIEW "+schema+".outbox_relays AS SELECT * FROM "+schema+".outbox_relays_t")
	refused("a view", nil, "outbox_relays", me)
	exec("DROP VIEW "+schema+".outbox_relays", "ALTER TABLE "+schema+".outbox_relays_t RENAME TO outbox_relays")

	exec("ALTER SCHEMA " + schema + " OWNER TO " + tenant)
	refused("a tenant's schema", nil, "schema "+schema, tenant)
	exec("ALTER SCHEMA " + schema + " OWNER TO CURRENT_USER")

	if err := pgtrust.Check(ctx, pool, schema, nil); err != nil {
		t.Errorf("restored: %v", err)
	}
	if err := pgtrust.Check(ctx, pool, schema+"_none", nil); err == nil {
		t.Error("a missing schema passes")
	}
}

// TestCheckPartitioned: a partitioned outbox_events passes with its
// partitions; a partition handed to a tenant is refused.
func TestCheckPartitioned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, outboxmigrate.PartitionConfig{Interval: time.Hour, Ahead: 2})
	if err := pgtrust.Check(ctx, pool, schema, nil); err != nil {
		t.Fatalf("a partitioned schema: %v", err)
	}
	var part string
	if err := pool.QueryRow(ctx, `SELECT relid::regclass::text FROM pg_partition_tree($1::regclass) WHERE isleaf LIMIT 1`,
		schema+".outbox_events").Scan(&part); err != nil {
		t.Fatal(err)
	}
	tenant := outboxtest.UniqueName(t, "tenant")
	for _, q := range []string{"CREATE ROLE " + tenant + " NOLOGIN NOSUPERUSER", "ALTER TABLE " + part + " OWNER TO " + tenant} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{"REASSIGN OWNED BY " + tenant + " TO CURRENT_USER", "DROP ROLE " + tenant} {
			if _, err := pool.Exec(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	var u *pgtrust.Untrusted
	if err := pgtrust.Check(ctx, pool, schema, nil); !errors.As(err, &u) || u.Owner != tenant {
		t.Errorf("a tenant's partition %s: %v; want untrusted, owner %s", part, err, tenant)
	}
}
