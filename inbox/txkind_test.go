package inbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
)

// txKind is one kind of transaction the inbox runs in: pgx (New, Handle,
// SeedTx, NewAdmin) or database/sql, here over the pgx stdlib driver
// (NewSQL, HandleSQL, SeedSQLTx, NewSQLAdmin), as sqlx and GORM users have.
// The tests that take a kind run the same cases on both.
type txKind struct {
	name string
	sql  bool
}

var txKinds = []txKind{{name: "pgx"}, {name: "database_sql", sql: true}}

// forKinds runs test once per kind, in parallel subtests.
func forKinds(t *testing.T, test func(t *testing.T, k txKind)) {
	t.Helper()
	for _, k := range txKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			test(t, k)
		})
	}
}

// sqlDB is a database/sql database over pool, closed when the test ends.
func sqlDB(t *testing.T, pool *pgxpool.Pool) *sql.DB {
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (k txKind) newInbox(t *testing.T, pool *pgxpool.Pool, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	var in *inbox.Inbox
	var err error
	if k.sql {
		in, err = inbox.NewSQL(sqlDB(t, pool), cfg)
	} else {
		in, err = inbox.New(pool, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (k txKind) newAdmin(t *testing.T, pool *pgxpool.Pool, cfg inbox.AdminConfig) *inbox.Admin {
	t.Helper()
	var a *inbox.Admin
	var err error
	if k.sql {
		a, err = inbox.NewSQLAdmin(sqlDB(t, pool), cfg)
	} else {
		a, err = inbox.NewAdmin(pool, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// execFunc runs a statement in the transaction at hand.
type execFunc func(ctx context.Context, sql string, args ...any) error

// handle delivers m to in (built by k.newInbox); effect runs in the
// delivery's transaction.
func (k txKind) handle(ctx context.Context, in *inbox.Inbox, m outbox.Message, effect func(ctx context.Context, exec execFunc) error) (inbox.Outcome, error) {
	if k.sql {
		return in.HandleSQL(ctx, m, func(ctx context.Context, tx *sql.Tx) error { return effect(ctx, sqlExec(tx)) })
	}
	return in.Handle(ctx, m, func(ctx context.Context, tx pgx.Tx) error { return effect(ctx, pgxExec(tx)) })
}

// handleMessage is handle through HandleMessage (HandleMessageSQL): effect
// receives the upgraded message.
func (k txKind) handleMessage(ctx context.Context, in *inbox.Inbox, m outbox.Message, effect func(ctx context.Context, exec execFunc, m outbox.Message) error) (inbox.Outcome, error) {
	if k.sql {
		return in.HandleMessageSQL(ctx, m, func(ctx context.Context, tx *sql.Tx, m outbox.Message) error { return effect(ctx, sqlExec(tx), m) })
	}
	return in.HandleMessage(ctx, m, func(ctx context.Context, tx pgx.Tx, m outbox.Message) error { return effect(ctx, pgxExec(tx), m) })
}

// callerTx is the application's own transaction of a kind: exec runs a
// statement in it, seed is in.SeedTx (SeedSQLTx) in it.
type callerTx struct {
	exec execFunc
	seed func(ctx context.Context, in *inbox.Inbox, aggregateType, aggregateID string, lastApplied int64, reason string) error
}

// inTx runs fn in a transaction of the kind, committed when fn returns nil.
func (k txKind) inTx(ctx context.Context, t *testing.T, pool *pgxpool.Pool, fn func(tx callerTx) error) error {
	if !k.sql {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return fn(callerTx{exec: pgxExec(tx), seed: func(ctx context.Context, in *inbox.Inbox, typ, id string, last int64, reason string) error {
				return in.SeedTx(ctx, tx, typ, id, last, reason)
			}})
		})
	}
	tx, err := sqlDB(t, pool).BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	err = fn(callerTx{exec: sqlExec(tx), seed: func(ctx context.Context, in *inbox.Inbox, typ, id string, last int64, reason string) error {
		return in.SeedSQLTx(ctx, tx, typ, id, last, reason)
	}})
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func pgxExec(tx pgx.Tx) execFunc {
	return func(ctx context.Context, sql string, args ...any) error {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}
}

func sqlExec(tx *sql.Tx) execFunc {
	return func(ctx context.Context, query string, args ...any) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}
}

// TestHandleOnTheOtherKindIsRefused: an Inbox runs its deliveries in the
// kind of transaction it was built for, and says which method to call
// otherwise, touching nothing.
func TestHandleOnTheOtherKindIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	in, _, effects := setup(t, txKinds[0])
	m := msg("o1", 1)
	if _, err := in.HandleSQL(ctx, m, func(context.Context, *sql.Tx) error { return nil }); err == nil || !strings.Contains(err.Error(), "call Handle") {
		t.Fatalf("HandleSQL on New's inbox: %v, want a refusal naming Handle", err)
	}
	if _, err := in.HandleMessageSQL(ctx, m, func(context.Context, *sql.Tx, outbox.Message) error { return nil }); err == nil || !strings.Contains(err.Error(), "call HandleMessage") {
		t.Fatalf("HandleMessageSQL on New's inbox: %v, want a refusal naming HandleMessage", err)
	}
	sqlIn, _, _ := setup(t, txKinds[1])
	if _, err := sqlIn.Handle(ctx, m, func(context.Context, pgx.Tx) error { return nil }); err == nil || !strings.Contains(err.Error(), "call HandleSQL") {
		t.Fatalf("Handle on NewSQL's inbox: %v, want a refusal naming HandleSQL", err)
	}
	if _, err := sqlIn.HandleMessage(ctx, m, func(context.Context, pgx.Tx, outbox.Message) error { return nil }); err == nil || !strings.Contains(err.Error(), "call HandleMessageSQL") {
		t.Fatalf("HandleMessage on NewSQL's inbox: %v, want a refusal naming HandleMessageSQL", err)
	}
	if last, err := in.LastSequence(ctx, "order", "o1"); err != nil || last != 0 || effects() != 0 {
		t.Fatalf("after the refusals: mark %d (%v), %d effects; want nothing recorded", last, err, effects())
	}
}
