package sideeffect_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox/sideeffect"
)

// txKind is one kind of transaction a Caller and the Admin run in: pgx
// (New, NewAdmin) or database/sql, here over the pgx stdlib driver (NewSQL,
// NewSQLAdmin), as sqlx and GORM users have. The tests that take a kind run
// the same cases on both.
type txKind struct {
	name string
	sql  bool
}

var txKinds = []txKind{{name: "pgx"}, {name: "database_sql", sql: true}}

// forKinds runs test once per kind, in subtests (setupKind marks them
// parallel).
func forKinds(t *testing.T, test func(t *testing.T, k txKind)) {
	t.Helper()
	for _, k := range txKinds {
		t.Run(k.name, func(t *testing.T) { test(t, k) })
	}
}

func (k txKind) newCaller(t *testing.T, pool *pgxpool.Pool, cfg sideeffect.Config) *sideeffect.Caller {
	t.Helper()
	var c *sideeffect.Caller
	var err error
	if k.sql {
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { _ = db.Close() })
		c, err = sideeffect.NewSQL(db, cfg)
	} else {
		c, err = sideeffect.New(pool, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (k txKind) newAdmin(t *testing.T, pool *pgxpool.Pool, cfg sideeffect.AdminConfig) *sideeffect.Admin {
	t.Helper()
	var a *sideeffect.Admin
	var err error
	if k.sql {
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { _ = db.Close() })
		a, err = sideeffect.NewSQLAdmin(db, cfg)
	} else {
		a, err = sideeffect.NewAdmin(pool, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return a
}
