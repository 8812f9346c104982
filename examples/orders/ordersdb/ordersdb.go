// Package ordersdb holds the example order system's own database
// migrations: the business tables of the order API (products, orders,
// order_items, order_idempotency_keys), of the inventory consumer
// (inventory_stock, inventory_reservations), of the payments consumer
// (payments) and of the fake payment provider
// (provider_charges, provider_refunds, provider_idempotency_keys,
// provider_ledger).
//
// Each part of the system applies its own set at start, beside
// outboxmigrate.Migrate for the outbox and inbox tables. The tables may share
// the outbox's schema (the default) or live in a schema of their own in the
// same database; the business rows and the outbox rows are always written in
// one transaction.
//
// Like outboxmigrate, the files are plain numbered .sql files with
// unqualified names, embedded in the binary, applied one transaction per file
// under a transaction-level advisory lock with search_path set to the schema.
// Applied versions are recorded per set in orders_schema_migrations.
package ordersdb

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/pgident"
)

//go:embed migrations
var files embed.FS

// Set names a group of migrations owned by one part of the system.
type Set string

// The migration sets.
const (
	// Orders are the order API's tables.
	Orders Set = "orders"
	// Inventory are the inventory consumer's tables.
	Inventory Set = "inventory"
	// Provider are the fake payment provider's tables (its own schema).
	Provider Set = "provider"
	// Payments are the payments consumer's tables.
	Payments Set = "payments"
)

// Migration is one versioned migration file of a set.
type Migration struct {
	Set     Set
	Version int
	Name    string
	SQL     string
}

// Migrations returns the set's migrations in version order.
func Migrations(set Set) ([]Migration, error) {
	dir := path.Join("migrations", string(set))
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return nil, fmt.Errorf("ordersdb: unknown migration set %q", set)
	}
	var out []Migration
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), ".up.sql")
		if !ok {
			continue
		}
		num, name, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("ordersdb: migration file %s has no version", e.Name())
		}
		text, err := files.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Set: set, Version: v, Name: name, SQL: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Conn is what Migrate needs; *pgxpool.Pool and *pgx.Conn satisfy it.
type Conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

const migrationsTable = "orders_schema_migrations"

// Migrate creates schema if needed and applies the set's migrations it does
// not have yet. It is idempotent and safe to run from several processes at
// once. It returns the versions it applied.
func Migrate(ctx context.Context, db Conn, schema string, set Set) ([]int, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return nil, err
	}
	ms, err := Migrations(set)
	if err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range ms {
		done, err := applyOne(ctx, db, s, m)
		if err != nil {
			return applied, fmt.Errorf("migrate %s (%s) to version %d (%s): %w", s.Name(), set, m.Version, m.Name, err)
		}
		if done {
			applied = append(applied, m.Version)
		}
	}
	return applied, nil
}

func applyOne(ctx context.Context, db Conn, s pgident.Schema, m Migration) (bool, error) {
	applied := false
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('orders.migrate.' || $1, 0))`, s.Name()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+s.Quoted()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+s.Quoted()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+migrationsTable+` (
			set_name   text        NOT NULL,
			version    integer     NOT NULL,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (set_name, version))`); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+migrationsTable+` WHERE set_name = $1 AND version = $2)`,
			string(m.Set), m.Version).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+migrationsTable+` (set_name, version, name) VALUES ($1, $2, $3)`,
			string(m.Set), m.Version, m.Name); err != nil {
			return err
		}
		applied = true
		return nil
	})
	return applied, err
}
