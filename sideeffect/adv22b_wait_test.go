package sideeffect_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestAdv22bWaitNonTextFieldsKeepTxUsable: WaitTx promises that a message
// it cannot store leaves the caller's transaction as it was. Beyond text,
// two fields have ranges narrower than Go's: schema_version is an integer
// (int4) and occurred_at a timestamptz (up to 294276 AD). A message with
// either out of range must be refused without aborting the transaction
// (ErrMessageNotStorable, as for text; an aborted inbox transaction is
// not). The bounds themselves are stored: year 294276 and 4713 BC.
func TestAdv22bWaitNonTextFieldsKeepTxUsable(t *testing.T) {
	forKinds(t, func(t *testing.T, k txKind) {
		b := setupKind(t, sideeffect.Neither, k)
		c := b.caller(t, nil)
		ctx := context.Background()
		base := (&waitWorld{}).message()
		for _, tc := range []struct {
			name string
			edit func(m *outbox.Message)
		}{
			{"schema version over int4", func(m *outbox.Message) { m.SchemaVersion = math.MaxInt32 + 1 }},
			{"negative schema version", func(m *outbox.Message) { m.SchemaVersion = math.MinInt32 - 1 }},
			{"occurred_at past timestamptz", func(m *outbox.Message) { m.OccurredAt = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC) }},
			{"occurred_at before timestamptz", func(m *outbox.Message) { m.OccurredAt = time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC) }},
			{"occurred_at just past timestamptz", func(m *outbox.Message) { m.OccurredAt = time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC) }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				bad := base
				bad.ID = uuid.New()
				tc.edit(&bad)
				clean := base
				clean.ID = uuid.New()
				run := func(wait func(sideeffect.Wait) error, exec func(string) error) error {
					err := wait(sideeffect.Wait{Consumer: "billing", Key: bad.ID.String(), Message: bad})
					if !errors.Is(err, sideeffect.ErrMessageNotStorable) {
						return fmt.Errorf("WaitTx of a message with %s: %v; want ErrMessageNotStorable", tc.name, err)
					}
					if err := exec(`SELECT 1`); err != nil {
						return fmt.Errorf("the transaction after WaitTx's error (%s): %v (aborted)", tc.name, err)
					}
					return wait(sideeffect.Wait{Consumer: "billing", Key: clean.ID.String(), Message: clean})
				}
				if k.sql {
					db := stdlib.OpenDBFromPool(b.pool)
					t.Cleanup(func() { _ = db.Close() })
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					if err := run(func(w sideeffect.Wait) error { return c.WaitSQLTx(ctx, tx, w) }, func(q string) error { _, err := tx.ExecContext(ctx, q); return err }); err != nil {
						_ = tx.Rollback()
						t.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
				} else if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					return run(func(w sideeffect.Wait) error { return c.WaitTx(ctx, tx, w) }, func(q string) error { _, err := tx.Exec(ctx, q); return err })
				}); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// TestAdv22bWaitStoresTimestamptzBounds: the range check is not narrower
// than PostgreSQL's: the first and last representable instants are stored.
func TestAdv22bWaitStoresTimestamptzBounds(t *testing.T) {
	b := setupKind(t, sideeffect.Neither, txKinds[0])
	c := b.caller(t, nil)
	ctx := context.Background()
	for _, at := range []time.Time{time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC), time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC)} {
		m := (&waitWorld{}).message()
		m.OccurredAt = at
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			return c.WaitTx(ctx, tx, sideeffect.Wait{Consumer: "billing", Key: m.ID.String(), Message: m})
		}); err != nil {
			t.Fatalf("WaitTx of occurred_at %s: %v", at, err)
		}
	}
}
