package main

// 'outbox migrate --status': which migrations a schema has, and which this
// binary would apply, without applying any.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// migrationStatus is 'outbox migrate --status --json'.
type migrationStatus struct {
	Schema string `json:"schema"`
	// Components is what the schema holds: "all" (the outbox and the
	// consumer side), "consumer" (migrate --only consumer: the versions
	// below are the consumer install's own), or "" (nothing).
	Components string `json:"components"`
	// Version is the highest migration applied (0: no outbox tables).
	Version int `json:"version"`
	// LatestVersion is the highest migration this binary has.
	LatestVersion int `json:"latest_version"`
	// UpToDate: nothing to apply, and the schema is not ahead of the binary.
	UpToDate bool `json:"up_to_date"`
	// Ahead: the schema has migrations this binary does not know (a newer
	// binary applied them).
	Ahead   bool               `json:"ahead"`
	Applied []appliedMigration `json:"applied"`
	Pending []pendingMigration `json:"pending"`
}

// appliedMigration is a migration recorded in the schema.
type appliedMigration struct {
	Version   int       `json:"version"`
	Name      string    `json:"name"`
	AppliedAt time.Time `json:"applied_at"`
}

// pendingMigration is a migration of this binary the schema lacks.
type pendingMigration struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
}

// readMigrationStatus reads the schema's applied migrations (none when it
// has no outbox tables) and compares them with this binary's.
func readMigrationStatus(ctx context.Context, pool *pgxpool.Pool, schema string) (migrationStatus, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return migrationStatus{}, err
	}
	st := migrationStatus{Schema: s.Name(), Components: string(outboxmigrate.ComponentsAll), Applied: []appliedMigration{}, Pending: []pendingMigration{}}
	steps := outboxmigrate.All()
	found, err := readApplied(ctx, pool, s.Table("outbox_schema_migrations"), &st.Applied)
	if err == nil && !found {
		// No outbox tables: a consumer's own install (migrate --only
		// consumer), or nothing.
		st.Components, steps = string(outboxmigrate.ComponentsConsumer), outboxmigrate.ConsumerMigrations()
		if found, err = readApplied(ctx, pool, s.Table("outbox_consumer_migrations"), &st.Applied); err == nil && !found {
			st.Components, steps = "", outboxmigrate.All()
		}
	}
	if err != nil {
		return st, fmt.Errorf("read the migrations of schema %s: %w", s.Name(), err)
	}
	have := map[int]bool{}
	for _, m := range st.Applied {
		have[m.Version] = true
		st.Version = max(st.Version, m.Version)
	}
	known := map[int]bool{}
	for _, m := range steps {
		known[m.Version] = true
		st.LatestVersion = m.Version
		if !have[m.Version] {
			st.Pending = append(st.Pending, pendingMigration{Version: m.Version, Name: m.Name})
		}
	}
	for _, m := range st.Applied {
		st.Ahead = st.Ahead || !known[m.Version]
	}
	st.UpToDate = len(st.Pending) == 0 && !st.Ahead
	return st, nil
}

// readApplied reads the migrations recorded in table into applied, and
// reports whether the table exists.
func readApplied(ctx context.Context, pool *pgxpool.Pool, table string, applied *[]appliedMigration) (bool, error) {
	rows, err := pool.Query(ctx, `SELECT version, name, applied_at FROM `+table+` ORDER BY version`)
	if err == nil {
		*applied, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (appliedMigration, error) {
			var m appliedMigration
			err := r.Scan(&m.Version, &m.Name, &m.AppliedAt)
			m.AppliedAt = m.AppliedAt.UTC()
			return m, err
		})
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // no table, no schema
		*applied = []appliedMigration{}
		return false, nil
	}
	return err == nil, err
}

// printMigrationStatus says in a line or a few where the schema stands.
func printMigrationStatus(w io.Writer, st migrationStatus) {
	if st.Components == string(outboxmigrate.ComponentsConsumer) {
		printConsumerStatus(w, st)
		return
	}
	switch {
	case st.Version == 0:
		fmt.Fprintf(w, "schema %s has no outbox tables; 'outbox migrate --schema %s' applies %d migrations (up to version %d)\n",
			st.Schema, st.Schema, len(st.Pending), st.LatestVersion)
	case st.Ahead:
		fmt.Fprintf(w, "schema %s is at version %d, ahead of this binary (version %d): a newer outbox migrated it\n", st.Schema, st.Version, st.LatestVersion)
	case st.UpToDate:
		fmt.Fprintf(w, "schema %s is up to date (version %d, %d migrations applied)\n", st.Schema, st.Version, len(st.Applied))
	default:
		fmt.Fprintf(w, "schema %s is at version %d; 'outbox migrate --schema %s' applies %d more (up to version %d):\n",
			st.Schema, st.Version, st.Schema, len(st.Pending), st.LatestVersion)
		for _, m := range st.Pending {
			fmt.Fprintf(w, "  %d %s\n", m.Version, m.Name)
		}
	}
}

// printConsumerStatus is printMigrationStatus for a consumer's own install.
func printConsumerStatus(w io.Writer, st migrationStatus) {
	switch {
	case st.Ahead:
		fmt.Fprintf(w, "schema %s holds the consumer side only, at consumer version %d, ahead of this binary (consumer version %d)\n", st.Schema, st.Version, st.LatestVersion)
	case st.UpToDate:
		fmt.Fprintf(w, "schema %s holds the consumer side only (the inbox, side effects and audit log), up to date at consumer version %d; 'outbox migrate --schema %s' would add the outbox tables\n",
			st.Schema, st.Version, st.Schema)
	default:
		fmt.Fprintf(w, "schema %s holds the consumer side only, at consumer version %d; 'outbox migrate --only consumer --schema %s' applies %d more (up to consumer version %d):\n",
			st.Schema, st.Version, st.Schema, len(st.Pending), st.LatestVersion)
		for _, m := range st.Pending {
			fmt.Fprintf(w, "  %d %s\n", m.Version, m.Name)
		}
	}
}
