// Package outboxtest holds helpers for tests that run against the real
// PostgreSQL and NATS servers of the development machine (and CI).
//
// Each test gets its own freshly migrated schema, dropped when the test ends,
// so tests never see each other's data and can run in parallel.
package outboxtest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/outboxmigrate"
)

// DatabaseURLDefault is the database tests use when DATABASE_URL is unset.
const DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// NATSURLDefault is the NATS server tests use when NATS_URL is unset.
const NATSURLDefault = "nats://127.0.0.1:4222"

// DatabaseURL returns DATABASE_URL or DatabaseURLDefault.
func DatabaseURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DatabaseURLDefault
}

// NATSURL returns NATS_URL or NATSURLDefault.
func NATSURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return NATSURLDefault
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

// UniqueName returns a short name unique to this test run, made of lower-case
// letters, digits and underscores, that starts with prefix.
func UniqueName(t testing.TB, prefix string) string {
	base := nonWord.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(base) > 30 {
		base = base[len(base)-30:]
	}
	return strings.Trim(fmt.Sprintf("%s_%s_%s", prefix, base, strings.ReplaceAll(uuid.NewString()[:8], "-", "")), "_")
}

// Pool opens a pool on DatabaseURL, closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, DatabaseURL())
	if err != nil {
		t.Fatalf("connect to %s: %v", DatabaseURL(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("PostgreSQL is not reachable at %s (start it, or set DATABASE_URL): %v", DatabaseURL(), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema creates and migrates a schema of its own for the test and returns a
// pool and the schema's name. The schema is dropped when the test ends
// (unless OUTBOX_TEST_KEEP is set, to inspect a failure).
func Schema(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return SchemaNamed(t, UniqueName(t, "t"))
}

// SchemaNamed is Schema with a schema name of the caller's choosing (make it
// unique, e.g. from UniqueName).
func SchemaNamed(t testing.TB, schema string) (*pgxpool.Pool, string) {
	t.Helper()
	pool := Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("migrate schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		if os.Getenv("OUTBOX_TEST_KEEP") != "" {
			t.Logf("keeping schema %s", schema)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return pool, schema
}

// PartitionedSchema is Schema with outbox_events partitioned
// (outboxmigrate.Partition with cfg).
func PartitionedSchema(t testing.TB, cfg outboxmigrate.PartitionConfig) (*pgxpool.Pool, string) {
	t.Helper()
	pool, schema := Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := outboxmigrate.Partition(ctx, pool, schema, cfg); err != nil {
		t.Fatalf("partition schema %s: %v", schema, err)
	}
	return pool, schema
}

// Eventually polls cond every 10ms until it returns true or timeout passes,
// then fails the test with msg. Use it to wait for a state written by another
// goroutine or process, never as a fixed sleep.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %s", timeout, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
