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
	st := migrationStatus{Schema: s.Name(), Applied: []appliedMigration{}, Pending: []pendingMigration{}}
	rows, err := pool.Query(ctx, `SELECT version, name, applied_at FROM `+s.Table("outbox_schema_migrations")+` ORDER BY version`)
	if err == nil {
		st.Applied, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (appliedMigration, error) {
			var m appliedMigration
			err := r.Scan(&m.Version, &m.Name, &m.AppliedAt)
			m.AppliedAt = m.AppliedAt.UTC()
			return m, err
		})
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"): // no table, no schema
		st.Applied = []appliedMigration{}
	case err != nil:
		return st, fmt.Errorf("read the migrations of schema %s: %w", s.Name(), err)
	}
	have := map[int]bool{}
	for _, m := range st.Applied {
		have[m.Version] = true
		st.Version = max(st.Version, m.Version)
	}
	known := map[int]bool{}
	for _, m := range outboxmigrate.All() {
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

// printMigrationStatus says in a line or a few where the schema stands.
func printMigrationStatus(w io.Writer, st migrationStatus) {
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
