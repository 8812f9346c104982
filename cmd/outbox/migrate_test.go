package main

import (
	"strings"
	"testing"
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
