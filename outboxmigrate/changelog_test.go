package outboxmigrate_test

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// changelogIndexCommands returns, per migration version, the SQL block that
// CHANGELOG.md's Upgrading sections give to build its indexes beforehand
// ("**Migration NNN** ...", then a ```sql block), as single statements.
func changelogIndexCommands(t *testing.T) map[int][]string {
	t.Helper()
	text, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)\\*\\*Migration (\\d+)\\*\\*[^\\n]*\\n\\s*```sql\\n(.*?)```")
	out := map[int][]string{}
	for _, m := range block.FindAllStringSubmatch(string(text), -1) {
		v, _ := strconv.Atoi(m[1])
		for _, stmt := range strings.Split(m[2], ";") {
			if stmt = strings.TrimSpace(stmt); stmt != "" {
				out[v] = append(out[v], stmt)
			}
		}
	}
	return out
}

var (
	createTable = regexp.MustCompile(`(?i)CREATE TABLE IF NOT EXISTS (\w+)`)
	createIndex = regexp.MustCompile(`(?is)CREATE (?:UNIQUE )?INDEX (?:CONCURRENTLY )?IF NOT EXISTS (\w+)\s+ON (?:\w+\.)?(\w+)`)
)

// TestChangelogUpgradeIndexes: every migration that builds an index on a
// table an earlier migration created (a table that may be big by then) has
// the commands to build it beforehand in the CHANGELOG's Upgrading; run in
// order on a schema at the migration before it, they work outside a
// transaction (CREATE INDEX CONCURRENTLY), the migration then keeps the
// indexes they built (it skips them, by name), and each has the definition
// the migration gives it on a new schema.
func TestChangelogUpgradeIndexes(t *testing.T) {
	t.Parallel()
	commands := changelogIndexCommands(t)
	var need []int
	for _, m := range outboxmigrate.All() {
		own := map[string]bool{}
		for _, c := range createTable.FindAllStringSubmatch(m.SQL, -1) {
			own[c[1]] = true
		}
		var onExisting []string
		for _, c := range createIndex.FindAllStringSubmatch(m.SQL, -1) {
			if !own[c[2]] && m.Version > 1 {
				onExisting = append(onExisting, c[1])
			}
		}
		if len(onExisting) == 0 {
			if len(commands[m.Version]) > 0 {
				t.Errorf("CHANGELOG gives index commands for migration %03d, which builds no index on an existing table", m.Version)
			}
			continue
		}
		need = append(need, m.Version)
		var given []string
		for _, stmt := range commands[m.Version] {
			if c := createIndex.FindStringSubmatch(stmt); c != nil {
				given = append(given, c[1])
			}
		}
		if strings.Join(given, ",") != strings.Join(onExisting, ",") {
			t.Errorf("migration %03d builds %v on existing tables; the CHANGELOG's Upgrading gives CREATE INDEX CONCURRENTLY for %v", m.Version, onExisting, given)
		}
	}
	if t.Failed() {
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := outboxtest.Pool(t)
	indexDefs := func(schema string, names []string) map[string]string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT c.relname, replace(pg_get_indexdef(c.oid), $1 || '.', 'SCHEMA.') || ' ' || i.indisvalid
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = ANY($2)`, schema, names)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]string{}
		for rows.Next() {
			var name, def string
			if err := rows.Scan(&name, &def); err != nil {
				t.Fatal(err)
			}
			out[name] = def
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	oids := func(schema string, names []string) map[string]uint32 {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT c.relname, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname = ANY($2)`, schema, names)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]uint32{}
		for rows.Next() {
			var name string
			var oid uint32
			if err := rows.Scan(&name, &oid); err != nil {
				t.Fatal(err)
			}
			out[name] = oid
		}
		return out
	}

	for _, v := range need {
		schema, ref := outboxtest.UniqueName(t, "cl"), outboxtest.UniqueName(t, "clref")
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ref+" CASCADE")
		})
		migrateThrough(t, ctx, pool, ref, v)
		migrateThrough(t, ctx, pool, schema, v-1)
		var names []string
		for _, stmt := range commands[v] {
			// One statement per Exec, outside a transaction, as psql in
			// autocommit runs them; the CHANGELOG writes the schema as outbox.
			if _, err := pool.Exec(ctx, strings.ReplaceAll(stmt, "outbox.", schema+".")); err != nil {
				t.Fatalf("migration %03d's CHANGELOG command %q: %v", v, stmt, err)
			}
			if c := createIndex.FindStringSubmatch(stmt); c != nil {
				names = append(names, c[1])
			}
		}
		before := oids(schema, names)
		if len(before) != len(names) {
			t.Fatalf("migration %03d: the commands built %v, want %v", v, before, names)
		}
		migrateFrom(t, ctx, pool, schema, v, v)
		after := oids(schema, names)
		got, want := indexDefs(schema, names), indexDefs(ref, names)
		for _, n := range names {
			if after[n] != before[n] {
				t.Errorf("migration %03d built %s again (the CHANGELOG's command used another name?)", v, n)
			}
			if got[n] != want[n] {
				t.Errorf("migration %03d: %s built by the CHANGELOG's command is\n\t%s\nthe migration's is\n\t%s", v, n, got[n], want[n])
			}
		}
	}
}
