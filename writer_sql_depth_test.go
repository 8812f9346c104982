package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestSQLEnqueueDeepJSONAgreesWithTheWriter: the SQL door promises "the same validation and
// sequencing as Writer", its refusals SQLSTATE 22023. A JSON payload nested
// deeply (tens of KB, far under the size limit):
//
//   - 10,001 deep: Writer refuses it (encoding/json's json.Valid stops at
//     depth 10,000); enqueue accepts and stores it;
//   - 20,000 deep: enqueue fails with 54001 (stack depth limit exceeded),
//     not 22023 with COLUMN = payload.
func TestSQLEnqueueDeepJSONAgreesWithTheWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	try := func(depth int) (goErr, sqlErr error) {
		payload := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		ev := orderEvent("deep", "Tick")
		ev.Payload = []byte(payload)
		goErr = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, ev)
			return err
		})
		_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, sqlErr = tx.Exec(ctx, `SELECT * FROM `+schema+`.enqueue('order', 'deep-sql', 'Tick', $1::text)`, payload)
			return errRollback
		})
		return goErr, sqlErr
	}
	if goErr, sqlErr := try(10001); (goErr == nil) != (sqlErr == nil) {
		t.Errorf("depth 10,001: Writer: %v; SQL enqueue: %v; they must agree", goErr, sqlErr)
	}
	_, sqlErr := try(20000)
	var pe *pgconn.PgError
	if !errors.As(sqlErr, &pe) || pe.Code != "22023" {
		t.Errorf("depth 20,000: SQL enqueue: %v; want SQLSTATE 22023 (the door's refusal), COLUMN payload", sqlErr)
	}
}
