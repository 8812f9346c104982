package outboxmigrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/pgident"
)

//go:embed migrations/*.sql consumer/*.sql
var files embed.FS

// Migration is one versioned migration file.
type Migration struct {
	// Version is the number the file name starts with.
	Version int
	// Name is the file name without its version and extension.
	Name string
	// SQL is the file's text.
	SQL string
}

// All returns every embedded migration in version order.
func All() []Migration { return readDir("migrations") }

func readDir(dir string) []Migration {
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		panic(err) // embedded at build time
	}
	var out []Migration
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".up.sql")
		num, name, ok := strings.Cut(base, "_")
		if !ok {
			panic("migration file without version: " + e.Name())
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			panic("migration file without version: " + e.Name())
		}
		text, err := files.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		// Two files with one version (branches merged without renumbering)
		// would apply only the first: refuse to build such a list.
		if out[i].Version == out[i-1].Version {
			panic(fmt.Sprintf("two migrations with version %d: %s and %s", out[i].Version, out[i-1].Name, out[i].Name))
		}
	}
	return out
}

// Conn is what the migrator needs: *pgx.Conn, *pgxpool.Pool and
// *pgxpool.Conn all satisfy it.
type Conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Result reports what Migrate did.
type Result struct {
	// Applied lists the versions applied by this call, in order.
	Applied []int
	// Current is the schema's version after the call.
	Current int
}

const migrationsTable = "outbox_schema_migrations"

// Migrate creates schema (pgident.DefaultSchema when empty) if needed and
// applies every migration it does not have yet. It is idempotent and safe to
// run from several processes at once. It installs every component
// (ComponentsAll); see MigrateComponents for a consumer's database.
func Migrate(ctx context.Context, db Conn, schema string) (Result, error) {
	return MigrateComponents(ctx, db, schema, ComponentsAll)
}

// MigrateComponents is Migrate for some of the components: ComponentsAll
// (Migrate), or ComponentsConsumer, the consumer side only, for a
// consumer's own database. Result.Current is the version of what it
// installs: the latest migration's for ComponentsAll, the consumer install's
// latest step's (see ConsumerMigrations) for ComponentsConsumer.
func MigrateComponents(ctx context.Context, db Conn, schema string, c Components) (Result, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return Result{}, err
	}
	steps, table, err := c.steps()
	if err != nil {
		return Result{}, err
	}
	var res Result
	for _, m := range steps {
		applied, err := applyOne(ctx, db, s, table, m)
		if err != nil {
			return res, fmt.Errorf("migrate %s to version %d (%s): %w", s.Name(), m.Version, m.Name, err)
		}
		if applied {
			res.Applied = append(res.Applied, m.Version)
		}
		res.Current = m.Version
	}
	return res, nil
}

func applyOne(ctx context.Context, db Conn, s pgident.Schema, table string, m Migration) (applied bool, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	// Serialise migrators of this schema. The lock is released at commit.
	if _, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('outbox.migrate.' || $1, 0))`, s.Name()); err != nil {
		return false, err
	}
	if _, err = tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+s.Quoted()); err != nil {
		return false, err
	}
	if _, err = tx.Exec(ctx, "SET LOCAL search_path TO "+s.Quoted()); err != nil {
		return false, err
	}
	if _, err = tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return false, err
	}
	var exists bool
	if err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE version = $1)`, m.Version).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, tx.Commit(ctx)
	}
	if _, err = tx.Exec(ctx, m.SQL); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Position > 0 {
			return false, fmt.Errorf("%w (at character %d of the file)", err, pgErr.Position)
		}
		return false, err
	}
	if _, err = tx.Exec(ctx, `INSERT INTO `+table+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// Version returns the highest migration applied to schema, or 0 when none is.
func Version(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string) (int, error) {
	return VersionComponents(ctx, db, schema, ComponentsAll)
}

// Versions is Version for many schemas in one statement (a process serving
// many outboxes, package outboxfleet): the highest migration applied to
// each, 0 for a schema without the migrations table. When one of them has
// no migrations table the statement fails, and each is read on its own.
func Versions(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schemas []string) (map[string]int, error) {
	out := make(map[string]int, len(schemas))
	if len(schemas) == 0 {
		return out, nil
	}
	parts := make([]string, len(schemas))
	for i, name := range schemas {
		s, err := pgident.NewSchema(name)
		if err != nil {
			return nil, err
		}
		parts[i] = `SELECT ` + strconv.Itoa(i) + `, coalesce(max(version), 0) FROM ` + s.Table(migrationsTable)
	}
	rows, err := db.Query(ctx, strings.Join(parts, "\nUNION ALL "), pgx.QueryExecModeSimpleProtocol)
	if err == nil {
		var i, v int
		_, err = pgx.ForEachRow(rows, []any{&i, &v}, func() error { out[schemas[i]] = v; return nil })
		if err == nil {
			return out, nil
		}
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != "42P01" && pgErr.Code != "3F000") {
		return nil, err
	}
	for _, name := range schemas {
		v, err := Version(ctx, db, name)
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// VersionComponents is Version for an install of some of the components:
// for ComponentsConsumer, the highest consumer step applied to schema
// (ConsumerMigrations), 0 when none is.
func VersionComponents(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string, c Components) (int, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return 0, err
	}
	_, table, err := c.steps()
	if err != nil {
		return 0, err
	}
	var v int
	err = db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+s.Table(table)).Scan(&v)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // undefined table / schema
		return 0, nil
	}
	return v, err
}

// SQL returns the migrations as one script for schema, for teams that apply
// SQL with their own tools. The script is idempotent.
func SQL(schema string) (string, error) { return SQLComponents(schema, ComponentsAll) }

// SQLComponents is SQL for some of the components (see MigrateComponents).
func SQLComponents(schema string, c Components) (string, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return "", err
	}
	steps, table, err := c.steps()
	if err != nil {
		return "", err
	}
	what := "outbox migrations"
	if c == ComponentsConsumer {
		what = "outbox consumer-side migrations"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- %s for schema %s\nBEGIN;\nCREATE SCHEMA IF NOT EXISTS %s;\nSET LOCAL search_path TO %s;\n", what, s.Name(), s.Quoted(), s.Quoted())
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());\n", table)
	for _, m := range steps {
		fmt.Fprintf(&b, "\n-- version %d: %s\n%s\nINSERT INTO %s (version, name) VALUES (%d, '%s') ON CONFLICT DO NOTHING;\n", m.Version, m.Name, m.SQL, table, m.Version, m.Name)
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}
