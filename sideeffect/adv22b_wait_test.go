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
// (an error is fine; an aborted inbox transaction is not).
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
		} {
			t.Run(tc.name, func(t *testing.T) {
				bad := base
				bad.ID = uuid.New()
				tc.edit(&bad)
				clean := base
				clean.ID = uuid.New()
				run := func(wait func(sideeffect.Wait) error, exec func(string) error) error {
					err := wait(sideeffect.Wait{Consumer: "billing", Key: bad.ID.String(), Message: bad})
					if err == nil {
						return fmt.Errorf("WaitTx of a message with %s stored it", tc.name)
					}
					t.Logf("refusal: %v (ErrMessageNotStorable: %v)", err, errors.Is(err, sideeffect.ErrMessageNotStorable))
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
