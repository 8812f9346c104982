package outboxtest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Database creates a database of the test's own on the shared server (so
// that pg_stat_database counts its transactions alone, or so that a test
// has a second database) and returns its URL and a pool on it; both are
// closed and the database dropped when the test ends.
func Database(t testing.TB, admin *pgxpool.Pool) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	name := UniqueName(t, "db")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return u.String(), pool
}
