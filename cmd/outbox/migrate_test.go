package main

import (
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestMigratePrintGrants checks the CLI wiring of --print-grants: the role
// flags reach the script, and bad input is refused in one line
// (outboxmigrate's TestGrantsLeastPrivilege tests the grants themselves).
func TestMigratePrintGrants(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := runOutbox(t, nil, "migrate", "--print-grants", "--schema", "shop", "--writer-role", "app", "--relay-role", "relayer", "--operator-role", "ops", "--consumer-role", "billing")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{
		`GRANT EXECUTE ON FUNCTION "shop".enqueue_many(jsonb) TO "app";`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON "shop"."outbox_relays" TO "relayer";`,
		`GRANT SELECT, INSERT ON "shop"."outbox_operations" TO "ops";`,
		`GRANT INSERT ON "shop"."processed_events" TO "billing";`,
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--print-grants output lacks %q:\n%s", want, stdout)
		}
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"migrate", "--print-grants", "--relay-role", "bad-name"}, 1, `relay role "bad-name": use letters, digits and underscores`},
		{[]string{"migrate", "--print-grants", "--print"}, 2, "--print and --print-grants are exclusive"},
	} {
		_, stderr, code := runOutbox(t, nil, c.args...)
		line := strings.TrimSpace(stderr)
		if code != c.code || !strings.Contains(line, c.want) || strings.Contains(line, "\n") {
			t.Errorf("outbox %s: exit %d, stderr %q; want exit %d and one line containing %q", strings.Join(c.args, " "), code, stderr, c.code, c.want)
		}
	}
}

// TestMigrateOnlyConsumer is `outbox migrate --only consumer`: it installs
// the consumer side only (no outbox_events), says so, prints the consumer
// script with --print, and refuses what it does not go with.
func TestMigrateOnlyConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := outboxtest.Pool(t)
	schema := outboxtest.UniqueName(t, "cli_cons")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })

	stdout, stderr, code := runOutbox(t, nil, "migrate", "--only", "consumer", "--schema", schema)
	if code != 0 || !strings.Contains(stdout, "the consumer side migrated to consumer version 16") {
		t.Fatalf("migrate --only consumer: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	var inboxTable, events bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		schema+".inbox_aggregates", schema+".outbox_events").Scan(&inboxTable, &events); err != nil || !inboxTable || events {
		t.Fatalf("after --only consumer: inbox_aggregates %v, outbox_events %v (%v); want the inbox table only", inboxTable, events, err)
	}
	stdout, _, code = runOutbox(t, nil, "migrate", "--only", "consumer", "--schema", schema)
	if code != 0 || !strings.Contains(stdout, "the consumer side is up to date") {
		t.Fatalf("second migrate --only consumer: exit %d, %q", code, stdout)
	}
	// --status says what the schema holds, in the consumer install's own
	// versions, instead of "no outbox tables, applies every migration".
	stdout, _, code = runOutbox(t, nil, "migrate", "--status", "--schema", schema)
	if code != 0 || !strings.Contains(stdout, "holds the consumer side only") || !strings.Contains(stdout, "up to date at consumer version 16") {
		t.Fatalf("migrate --status on a consumer-only schema: exit %d, %q", code, stdout)
	}
	stdout, _, code = runOutbox(t, nil, "migrate", "--status", "--json", "--schema", schema)
	if code != 0 || !strings.Contains(stdout, `"components": "consumer"`) || !strings.Contains(stdout, `"up_to_date": true`) {
		t.Fatalf("migrate --status --json on a consumer-only schema: exit %d, %s", code, stdout)
	}
	// The outbox's commands say what the schema holds and where to look.
	if _, stderr, code := runOutbox(t, nil, "status", "--schema", schema); code == 0 || !strings.Contains(stderr, "holds the consumer side only") ||
		!strings.Contains(stderr, "outbox inbox status") {
		t.Fatalf("status on a consumer-only schema: exit %d, stderr %q", code, stderr)
	}
	// The consumer side's commands work on such a schema.
	if _, stderr, code := runOutbox(t, nil, "inbox", "status", "--schema", schema); code != 0 {
		t.Fatalf("inbox status on a consumer-only schema: exit %d: %s", code, stderr)
	}

	stdout, _, code = runOutbox(t, nil, "migrate", "--only", "consumer", "--print", "--schema", "shop")
	if code != 0 || !strings.Contains(stdout, "consumer-side migrations for schema shop") || !strings.Contains(stdout, "FUNCTION inbox_claim") ||
		strings.Contains(stdout, "CREATE TABLE IF NOT EXISTS outbox_events") {
		t.Fatalf("migrate --only consumer --print: exit %d:\n%s", code, stdout)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--only", "producer"}, `--only takes "consumer"`},
		{[]string{"migrate", "--only", "consumer", "--status"}, "--only goes with a migrate or --print"},
		{[]string{"migrate", "--only", "consumer", "--print-grants"}, "--only goes with a migrate or --print"},
	} {
		_, stderr, code := runOutbox(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("outbox %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), code, stderr, c.want)
		}
	}
}
