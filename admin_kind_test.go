package outbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
)

// adminKind is one kind of transaction the Admin runs in: pgx (NewAdmin)
// or database/sql, here over the pgx stdlib driver (NewSQLAdmin), as sqlx
// and GORM users have. The tests that take a kind run the same cases on
// both.
type adminKind struct {
	name string
	sql  bool
}

var adminKinds = []adminKind{{name: "pgx"}, {name: "database_sql", sql: true}}

// forAdminKinds runs test once per kind, in parallel subtests.
func forAdminKinds(t *testing.T, test func(t *testing.T, k adminKind)) {
	t.Helper()
	for _, k := range adminKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			test(t, k)
		})
	}
}

// newAdmin is an Admin of kind k on schema.
func (k adminKind) newAdmin(t *testing.T, pool *pgxpool.Pool, schema string) *outbox.Admin {
	t.Helper()
	return k.newAdminWith(t, pool, outbox.AdminConfig{Tables: outbox.Schema(schema)})
}

func (k adminKind) newAdminWith(t *testing.T, pool *pgxpool.Pool, cfg outbox.AdminConfig) *outbox.Admin {
	t.Helper()
	var a *outbox.Admin
	var err error
	if k.sql {
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { _ = db.Close() })
		a, err = outbox.NewSQLAdmin(db, cfg)
	} else {
		a, err = outbox.NewAdmin(pool, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return a
}
