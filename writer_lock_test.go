package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestOneCallLocksAggregatesInAFixedOrder pins the rule documented on
// InsertTx (issue 8, item 6). Each aggregate's counter row stays locked until
// commit. Two transactions that each call InsertTx once per aggregate, for A
// and B in opposite orders, deadlock (PostgreSQL aborts one of them); the
// same transactions recording both events in one call lock A and B in a fixed
// order, so the second waits for the first and both commit.
func TestOneCallLocksAggregatesInAFixedOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	a, b := orderEvent("A", "Touched"), orderEvent("B", "Touched")
	begin := func() pgx.Tx {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		return tx
	}

	// Two calls each, opposite orders: a deadlock.
	tx1, tx2 := begin(), begin()
	if _, err := w.InsertTx(ctx, tx1, a); err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertTx(ctx, tx2, b); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() { _, err := w.InsertTx(ctx, tx1, b); second <- err }() // waits for tx2
	_, err2 := w.InsertTx(ctx, tx2, a)                               // waits for tx1: a cycle
	var err1 error
	if err2 != nil {
		_ = tx2.Rollback(ctx) // PostgreSQL chose tx2: tx1 goes on
		err1 = <-second
	} else {
		err1 = <-second
	}
	if !isDeadlock(err1) && !isDeadlock(err2) {
		t.Fatalf("two calls in opposite orders: %v / %v, want one of them aborted as a deadlock (40P01)", err1, err2)
	}
	// Whichever PostgreSQL aborted, the other still holds both counter rows.
	_ = tx1.Rollback(ctx)
	_ = tx2.Rollback(ctx)

	// One call each, opposite orders: no deadlock, the second waits.
	tx3, tx4 := begin(), begin()
	if _, err := w.InsertTx(ctx, tx3, a, b); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := w.InsertTx(ctx, tx4, b, a)
		if err == nil {
			err = tx4.Commit(ctx)
		}
		done <- err
	}()
	pid := tx4.Conn().PgConn().PID()
	outboxtest.Eventually(t, 10*time.Second, "the second transaction waits on a counter row lock", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		return err == nil && waiting
	})
	if err := tx3.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("one call in the opposite order: %v, want it to commit after the first", err)
	}
	rows, _ := pool.Query(ctx, `SELECT aggregate_sequence FROM `+schema+`.outbox_events ORDER BY aggregate_id, aggregate_sequence`)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(seqs) != 4 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 1 || seqs[3] != 2 {
		t.Fatalf("sequences %v (%v), want A 1,2 and B 1,2", seqs, err)
	}
}

func isDeadlock(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "40P01"
}
