package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestQuarantineListFitsAndWide is issue 22, item 12: by default a row
// with a long error and a long aggregate id stays one line of at most 120
// runes, keeping the event id whole (retry and skip take it); --wide shows
// the error and the aggregate whole.
func TestQuarantineListFitsAndWide(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	longID := "customer-" + strings.Repeat("0123456789", 8) + "-tail"
	longError := "publish: nats: " + strings.Repeat("the broker refused the message because its subject has no stream; ", 5) +
		"\nsecond line\tand a tab: end of error"
	id := insertEvent(t, pool, schema, longID, 7, "quarantined_at = now() - interval '3 hours', attempt_count = 12, last_error = $$"+longError+"$$")
	short := insertEvent(t, pool, schema, "o1", 1, "quarantined_at = now(), attempt_count = 1, last_error = 'rejected'")
	insertEvent(t, pool, schema, longID, 8, "")

	stdout, stderr, code := runOutbox(t, nil, "quarantine", "list", "--schema", schema)
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "EVENT ID") {
		t.Fatalf("want a header and two rows, got:\n%s", stdout)
	}
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > 120 {
			t.Errorf("line of %d runes (want at most 120): %q", n, l)
		}
		if strings.HasSuffix(l, " ") {
			t.Errorf("trailing space: %q", l)
		}
	}
	row := lines[1]
	for _, want := range []string{id.String(), "order/c", "-tail#7", "…", "publish: nats: the broker", "  12  ", "  3h0"} {
		if !strings.Contains(row, want) {
			t.Errorf("row lacks %q: %q", want, row)
		}
	}
	if strings.Contains(row, "end of error") || strings.Contains(row, longID) {
		t.Errorf("a 120-column row shows the whole error or aggregate id: %q", row)
	}
	if !strings.Contains(lines[2], short.String()) || !strings.Contains(lines[2], "order/o1#1") || !strings.HasSuffix(lines[2], "rejected") {
		t.Errorf("short row %q", lines[2])
	}

	stdout, stderr, code = runOutbox(t, nil, "quarantine", "list", "--schema", schema, "--wide")
	if code != 0 {
		t.Fatalf("list --wide: exit %d: %s", code, stderr)
	}
	lines = strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("--wide: want a header and two rows, one line each, got:\n%s", stdout)
	}
	wholeError := strings.Join(strings.Fields(longError), " ")
	if !strings.Contains(lines[1], wholeError) || !strings.Contains(lines[1], "order/"+longID) || strings.Contains(lines[1], "…") {
		t.Errorf("--wide row lacks the whole error %q or aggregate: %q", wholeError, lines[1])
	}
	if !strings.HasPrefix(lines[0], "EVENT ID") || !strings.Contains(lines[0], "QUARANTINED") {
		t.Errorf("--wide header %q", lines[0])
	}

	_, stderr, code = runOutbox(t, nil, "quarantine", "list", "--schema", schema, "--wide", "--json")
	if code != 2 || !strings.Contains(stderr, "--wide and --json are exclusive") {
		t.Errorf("--wide --json: exit %d: %s", code, stderr)
	}
	stdout, stderr, _ = runOutbox(t, nil, "quarantine", "list", "--help")
	for _, want := range []string{"--wide", "--json", "120 columns"} {
		if !strings.Contains(stdout+stderr, want) {
			t.Errorf("quarantine list --help lacks %q", want)
		}
	}
}

// TestQuarantineListJSONKeys checks the JSON of quarantine list: one
// array, snake_case keys, the values as stored.
func TestQuarantineListJSONKeys(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	id := insertEvent(t, pool, schema, "o9", 3, "quarantined_at = now(), attempt_count = 4, last_error = 'refused: schema'")
	insertEvent(t, pool, schema, "o9", 4, "")
	stdout, stderr, code := runOutbox(t, nil, "quarantine", "list", "--schema", schema, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("quarantine list --json: %v\n%s", err, stdout)
	}
	r := rows[0]
	want := map[string]any{"event_id": id.String(), "aggregate_type": "order", "aggregate_id": "o9", "aggregate_sequence": 3.0,
		"event_type": "Step", "attempt_count": 4.0, "last_error": "refused: schema", "blocked": 1.0}
	for k, v := range want {
		if r[k] != v {
			t.Errorf("%s = %v, want %v", k, r[k], v)
		}
	}
	if _, ok := r["quarantined_at"].(string); !ok {
		t.Errorf("no quarantined_at: %v", r)
	}
	checkSnakeCase(t, stdout)
}

// TestMigrateStatus is `outbox migrate --status [--json]` on a schema
// without tables, one behind and one up to date: it reads and changes
// nothing.
func TestMigrateStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	all := outboxmigrate.All()
	latest := all[len(all)-1]

	var st migrationStatus
	statusJSON := func(schema string) {
		t.Helper()
		stdout, stderr, code := runOutbox(t, nil, "migrate", "--status", "--json", "--schema", schema)
		if code != 0 {
			t.Fatalf("migrate --status --json: exit %d: %s", code, stderr)
		}
		st = migrationStatus{}
		if err := json.Unmarshal([]byte(stdout), &st); err != nil {
			t.Fatalf("migrate --status --json: %v\n%s", err, stdout)
		}
		checkSnakeCase(t, stdout)
	}

	statusJSON(schema)
	if st.Schema != schema || st.Version != latest.Version || st.LatestVersion != latest.Version || !st.UpToDate || st.Ahead ||
		len(st.Applied) != len(all) || len(st.Pending) != 0 || st.Applied[0].Name != all[0].Name || time.Since(st.Applied[0].AppliedAt) > time.Hour {
		t.Fatalf("up to date schema: %+v", st)
	}
	stdout, _, code := runOutbox(t, nil, "migrate", "--status", "--schema", schema)
	if code != 0 || strings.TrimSpace(stdout) != "schema "+schema+" is up to date (version "+itoa(latest.Version)+", "+itoa(len(all))+" migrations applied)" {
		t.Fatalf("migrate --status: exit %d: %q", code, stdout)
	}

	// One behind: the last migration's row removed (its objects stay; the
	// status reads the table only).
	if _, err := pool.Exec(ctx, `DELETE FROM `+schema+`.outbox_schema_migrations WHERE version = $1`, latest.Version); err != nil {
		t.Fatal(err)
	}
	statusJSON(schema)
	if st.UpToDate || st.Version != all[len(all)-2].Version || len(st.Pending) != 1 || st.Pending[0].Version != latest.Version || st.Pending[0].Name != latest.Name {
		t.Fatalf("schema one behind: %+v", st)
	}
	stdout, _, _ = runOutbox(t, nil, "migrate", "--status", "--schema", schema)
	if !strings.Contains(stdout, "applies 1 more") || !strings.Contains(stdout, itoa(latest.Version)+" "+latest.Name) {
		t.Fatalf("migrate --status one behind: %q", stdout)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_schema_migrations`).Scan(&n); err != nil || n != len(all)-1 {
		t.Fatalf("--status changed the schema: %d rows (%v)", n, err)
	}

	// No tables at all, and the schema not created by --status.
	empty := outboxtest.UniqueName(t, "nomig")
	statusJSON(empty)
	if st.Version != 0 || st.UpToDate || len(st.Applied) != 0 || len(st.Pending) != len(all) {
		t.Fatalf("empty schema: %+v", st)
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, empty).Scan(&exists); err != nil || exists {
		t.Fatalf("--status created schema %s (%v)", empty, err)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--json"}, "--json goes with --status"},
		{[]string{"migrate", "--status", "--print"}, "are exclusive"},
	} {
		_, stderr, code := runOutbox(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("outbox %v: exit %d: %s", c.args, code, stderr)
		}
	}
	stdout, stderr, _ := runOutbox(t, nil, "migrate", "--help")
	if help := stdout + stderr; !strings.Contains(help, "--status") || !strings.Contains(help, "--json") {
		t.Errorf("migrate --help lacks --status or --json:\n%s", stdout)
	}
}

// TestReadCommandsJSON runs every read command of outbox with --json on one
// schema and checks that each prints one JSON document with snake_case
// keys carrying the schema's values.
func TestReadCommandsJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	insertEvent(t, pool, schema, "r1", 1, "published_at = now()")
	insertEvent(t, pool, schema, "r1", 2, "")
	poison := insertEvent(t, pool, schema, "q1", 1, "quarantined_at = now(), attempt_count = 2, last_error = 'refused'")
	// A parked side-effect attempt, for status's side_effects and the
	// sideeffect commands.
	c, err := sideeffect.New(pool, sideeffect.Config{Name: "mail.send", Schema: schema, Mode: sideeffect.Neither})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "evt-1", nil, func(context.Context, string) ([]byte, error) { return nil, errors.New("connection reset") }); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "evt-1", nil, func(context.Context, string) ([]byte, error) { return nil, nil }); !errors.Is(err, sideeffect.ErrParked) {
		t.Fatal(err)
	}
	obj := func(v any) map[string]any { m, _ := v.(map[string]any); return m }
	s := []string{"--schema", schema, "--json"}
	for _, c := range []struct {
		args  []string
		check func(v any) bool
	}{
		{[]string{"status"}, func(v any) bool {
			return obj(v)["pending"] == 1.0 && obj(v)["quarantined"] == 1.0 && obj(obj(v)["side_effects"])["schema"] == schema
		}},
		{[]string{"quarantine", "list"}, func(v any) bool {
			l, _ := v.([]any)
			return len(l) == 1 && obj(l[0])["event_id"] == poison.String()
		}},
		{[]string{"inbox", "status"}, func(v any) bool { return obj(v) != nil }},
		{[]string{"sideeffect", "parked"}, func(v any) bool {
			l, _ := obj(v)["attempts"].([]any)
			return len(l) == 1 && obj(l[0])["key"] == "evt-1" && obj(l[0])["state"] == "parked"
		}},
		{[]string{"sideeffect", "show", "--name", "mail.send", "--key", "evt-1"}, func(v any) bool {
			return obj(v)["name"] == "mail.send" && obj(v)["last_error"] == "connection reset"
		}},
		{[]string{"replay", "--dry-run", "--all"}, func(v any) bool { return obj(v)["events"] == 1.0 }},
		{[]string{"migrate", "--status"}, func(v any) bool { return obj(v)["up_to_date"] == true }},
	} {
		stdout, stderr, code := runOutbox(t, nil, append(c.args, s...)...)
		if code != 0 {
			t.Errorf("outbox %v --json: exit %d: %s", c.args, code, stderr)
			continue
		}
		var v any
		dec := json.NewDecoder(strings.NewReader(stdout))
		if err := dec.Decode(&v); err != nil || dec.More() {
			t.Errorf("outbox %v --json: not one JSON document (%v):\n%s", c.args, err, stdout)
			continue
		}
		if !c.check(v) {
			t.Errorf("outbox %v --json: unexpected values:\n%s", c.args, stdout)
		}
		checkSnakeCase(t, stdout)
		cmdArgs := append(append([]string{}, c.args[:min(2, len(c.args))]...), "--help")
		help, helpErr, _ := runOutbox(t, nil, cmdArgs...)
		if !strings.Contains(help+helpErr, "-json") {
			t.Errorf("outbox %v does not document --json", cmdArgs)
		}
	}
}

// checkSnakeCase fails t when a key of the JSON document doc is not
// snake_case (lower-case letters, digits and underscores).
func checkSnakeCase(t *testing.T, doc string) {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if k == "" || strings.Trim(k, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
					if _, err := uuid.Parse(k); err != nil && !strings.Contains(path, "detail") {
						t.Errorf("key %q at %s is not snake_case", k, path)
					}
				}
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		}
	}
	walk("", v)
}

func itoa(n int) string { return strconv.Itoa(n) }
