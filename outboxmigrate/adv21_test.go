package outboxmigrate_test

// Hostile review of the partitioned outbox's conversion, helper adv21
// (issue 21, part 1). Each test here failed on main before its fix.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// Finding C: the conversion copies the rights on outbox_events (and its
// columns) to the new parent with quote_ident(grantee::regrole::text); a
// regrole prints already quoted where the name needs it, so a role such as
// "Reporting-Reader" (upper case, a hyphen) was quoted twice and the
// conversion failed on a role that does not exist.
func TestPartitionAdv21GrantsToQuotedRoleName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := partitionSchema(t)
	role := "Adv21-" + outboxtest.UniqueName(t, "r")
	quoted := pgx.Identifier{role}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE ROLE "+quoted+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+quoted)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+quoted)
	})
	for _, g := range []string{"GRANT SELECT ON " + schema + ".outbox_events TO " + quoted,
		"GRANT UPDATE (available_at) ON " + schema + ".outbox_events TO " + quoted} {
		if _, err := pool.Exec(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	if err := enqueue(t, pool, schema, "a", nil); err != nil {
		t.Fatal(err)
	}
	res, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{Interval: time.Hour, Ahead: 2})
	if err != nil {
		t.Fatalf("conversion with a grant to %s: %v", quoted, err)
	}
	if res.Kept == "" {
		t.Fatalf("result %+v, want the events kept", res)
	}
	var sel, upd bool
	if err := pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2::regclass, 'SELECT'), has_column_privilege($1, $2::regclass, 'available_at', 'UPDATE')`,
		role, schema+".outbox_events").Scan(&sel, &upd); err != nil || !sel || !upd {
		t.Fatalf("%s on the parent: SELECT %v, UPDATE (available_at) %v, %v: want both copied", quoted, sel, upd, err)
	}
}

// Finding D: the conversion adds a CHECK constraint on the live table
// (event_id before the end of the interval after now's) before the swap;
// a swap that fails (a name in the way, a grant it cannot copy, a lock it
// waits for cancelled) left that constraint on the plain table, where,
// once an interval or two passed, it refused every new event (SQLSTATE
// 23514 on outbox_events_partition_range): a failed conversion turned into
// a writers' outage later.
func TestPartitionAdv21FailedSwapLeavesNoRangeCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := partitionSchema(t)
	if err := enqueue(t, pool, schema, "a", nil); err != nil {
		t.Fatal(err)
	}
	// The swap renames the table after its first interval: a table of
	// that name in the schema makes it fail, after the range check.
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	in := partman.Name(partman.Align(now, time.Hour))
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.`+in+` (x int)`); err != nil {
		t.Fatal(err)
	}
	_, err := outboxmigrate.Partition(ctx, pool, schema, outboxmigrate.PartitionConfig{Interval: time.Hour, Ahead: 2})
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("conversion with %s in the way: %v, want it to fail", in, err)
	}
	var left bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = $1::regclass AND conname = 'outbox_events_partition_range')`,
		schema+".outbox_events").Scan(&left); err != nil {
		t.Fatal(err)
	}
	// An event whose id is three hours ahead (an application clock ahead;
	// every event, three hours later) goes in as before the conversion.
	ahead := partman.Bound(now.Add(3 * time.Hour))
	ahead[6], ahead[8], ahead[15] = 0x70, 0x80, 1
	if err := enqueue(t, pool, schema, "b", &ahead); err != nil || left {
		t.Fatalf("after the failed conversion the range check is left %v; an event of 3 hours ahead: %v: want no check left and the event written", left, err)
	}
}
