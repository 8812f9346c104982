package sideeffect_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestWaitRefusesTextPostgreSQLCannotStore: WaitTx stores the message as
// given or not at all. A header (name or value) or a text field holding a
// NUL byte or bytes that are not UTF-8, which the outbox writer never
// writes, is refused with ErrMessageNotStorable, naming the field, before
// anything runs in the caller's transaction: the transaction stays usable
// (a statement PostgreSQL refused would have aborted it, and the consumer's
// inbox row with it), and a WaitTx of the cleaned message in it commits.
// Bytes that are not UTF-8 are refused too, not stored as U+FFFD.
func TestWaitRefusesTextPostgreSQLCannotStore(t *testing.T) {
	forKinds(t, testWaitRefusesTextPostgreSQLCannotStore)
}

func testWaitRefusesTextPostgreSQLCannotStore(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Neither, k)
	c := b.caller(t, nil)
	ctx := context.Background()
	base := (&waitWorld{}).message()
	for _, tc := range []struct {
		name, field string
		edit        func(m *outbox.Message)
	}{
		{"NUL in a header value", `header "x-note"`, func(m *outbox.Message) { m.Headers = map[string]string{"x-note": "a\x00b"} }},
		{"NUL in a header name", `header "x-\x00"`, func(m *outbox.Message) { m.Headers = map[string]string{"x-\x00": "v"} }},
		{"Latin-1 in a header value", `header "x-note"`, func(m *outbox.Message) { m.Headers = map[string]string{"x-note": "caf\xe9"} }},
		{"NUL in the aggregate id", "Message.AggregateID", func(m *outbox.Message) { m.AggregateID = "ord\x001" }},
		{"NUL in the type", "Message.Type", func(m *outbox.Message) { m.Type = "Stock\x00Reserved" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := base
			bad.ID = uuid.New()
			tc.edit(&bad)
			clean := bad
			clean.Headers, clean.AggregateID, clean.Type = base.Headers, base.AggregateID, base.Type
			// run fails by returning an error, so that the transaction is
			// rolled back before the test stops (a test stopped inside it
			// would leave it open, and the schema's drop waiting for it).
			run := func(wait func(sideeffect.Wait) error, exec func(string) error) error {
				err := wait(sideeffect.Wait{Consumer: "billing", Key: bad.ID.String(), Message: bad})
				if !errors.Is(err, sideeffect.ErrMessageNotStorable) {
					return fmt.Errorf("WaitTx of a message with %s: %v; want ErrMessageNotStorable", tc.name, err)
				}
				if msg := err.Error(); !strings.Contains(msg, strings.ReplaceAll(tc.field, "\x00", `\x00`)) {
					t.Errorf("the refusal does not name %s: %s", tc.field, msg)
				}
				if err := exec(`SELECT 1`); err != nil {
					return fmt.Errorf("the transaction after the refusal: %v (aborted)", err)
				}
				if err := wait(sideeffect.Wait{Consumer: "billing", Key: clean.ID.String(), Message: clean}); err != nil {
					return fmt.Errorf("WaitTx of the cleaned message in the same transaction: %v", err)
				}
				return nil
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
			var n int
			var headers string
			if err := b.pool.QueryRow(ctx, `SELECT count(*), coalesce(min(headers::text), '') FROM `+b.schema+`.side_effect_waits WHERE event_id = $1`, clean.ID).Scan(&n, &headers); err != nil || n != 1 {
				t.Fatalf("the cleaned message's wait: %d rows, %v; want 1", n, err)
			}
			if strings.Contains(headers, `\ufffd`) || strings.Contains(headers, "\ufffd") {
				t.Fatalf("the stored headers hold U+FFFD: %s", headers)
			}
		})
	}
}
