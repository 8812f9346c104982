package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestInsertTxCallsOutOfOrderAreRefused is the regression test of issue
// 19, item 12 (and pins the rule of issue 8, item 6). Each aggregate's
// counter row stays locked until commit. Two transactions that each call
// InsertTx once per aggregate, for A and B in opposite orders, used to
// deadlock: PostgreSQL aborted one of them after deadlock_timeout. Now a
// call that would lock an aggregate sorting before one the transaction
// already holds is refused at once with ErrInsertOrder, before it locks
// anything: the transaction in order goes on and commits, nobody deadlocks.
// The same transactions recording both events in one call lock A and B in a
// fixed order, so the second waits for the first and both commit.
func TestInsertTxCallsOutOfOrderAreRefused(t *testing.T) {
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

	// Two goroutines, two calls each, opposite orders: A then B is in
	// order and waits for B; B then A is refused at its second call.
	tx1, tx2 := begin(), begin()
	if _, err := w.InsertTx(ctx, tx1, a); err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertTx(ctx, tx2, b); err != nil {
		t.Fatal(err)
	}
	pid := tx1.Conn().PgConn().PID()
	first := make(chan error, 1)
	go func() { // A then B: waits for tx2's B, then commits
		_, err := w.InsertTx(ctx, tx1, b)
		if err == nil {
			err = tx1.Commit(ctx)
		}
		first <- err
	}()
	outboxtest.Eventually(t, 10*time.Second, "A then B waits for B", func() bool { return waitsOnLock(t, pool, pid) })
	_, err2 := w.InsertTx(ctx, tx2, a) // B then A
	_ = tx2.Rollback(ctx)
	err1 := <-first
	if isDeadlock(err1) || isDeadlock(err2) {
		t.Fatalf("two calls in opposite orders: %v / %v: a deadlock", err1, err2)
	}
	t.Logf("B then A: %v", err2)
	if err1 != nil || !errors.Is(err2, outbox.ErrInsertOrder) {
		t.Fatalf("two calls in opposite orders: A then B: %v, B then A: %v; want A then B committed and B then A refused with ErrInsertOrder", err1, err2)
	}

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
	pid = tx4.Conn().PgConn().PID()
	outboxtest.Eventually(t, 10*time.Second, "the second transaction waits on a counter row lock", func() bool { return waitsOnLock(t, pool, pid) })
	if err := tx3.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("one call in the opposite order: %v, want it to commit after the first", err)
	}
	rows, _ := pool.Query(ctx, `SELECT aggregate_sequence FROM `+schema+`.outbox_events ORDER BY aggregate_id, aggregate_sequence`)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(seqs) != 6 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 || seqs[3] != 1 || seqs[4] != 2 || seqs[5] != 3 {
		t.Fatalf("sequences %v (%v), want A 1,2,3 and B 1,2,3", seqs, err)
	}
}

// TestInsertTxCallsInOrderAreAccepted: further calls in a transaction are
// accepted when they lock nothing out of order: the same aggregate again,
// aggregates that sort after every one already written, and ones already
// written (in any order, several per call). A refused call writes nothing
// and leaves the transaction usable, on both the pgx and the database/sql
// path.
func TestInsertTxCallsInOrderAreAccepted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	ev := func(id string) outbox.Event { return orderEvent(id, "Touched") }
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i, evs := range [][]outbox.Event{
			{ev("B")},                   // first call
			{ev("B")},                   // the same aggregate again
			{ev("D"), ev("C")},          // after B
			{ev("B")},                   // held already
			{ev("C"), ev("D"), ev("E")}, // held, and E after D
			{ev("F")},
		} {
			if _, err := w.InsertTx(ctx, tx, evs...); err != nil {
				t.Errorf("call %d: %v", i+1, err)
			}
		}
		for _, ids := range [][]string{{"A"}, {"E", "A"}, {"B", "EE"}} {
			var evs []outbox.Event
			for _, id := range ids {
				evs = append(evs, ev(id))
			}
			if _, err := w.InsertTx(ctx, tx, evs...); !errors.Is(err, outbox.ErrInsertOrder) {
				t.Errorf("call of %v after F: %v, want ErrInsertOrder", ids, err)
			}
		}
		_, err := w.InsertTx(ctx, tx, ev("G")) // the transaction is still usable
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events`).Scan(&n); err != nil || n != 10 {
		t.Fatalf("%d events (%v), want the 10 of the accepted calls", n, err)
	}

	// An aggregate is held only under its own type and id (a key with the
	// two swapped sorts before order/B and is not held).
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.InsertTx(ctx, tx, ev("B")); err != nil {
			return err
		}
		swapped := outbox.Event{AggregateType: "B", AggregateID: "order", Type: "Touched", Payload: []byte(`{}`)}
		if _, err := w.InsertTx(ctx, tx, swapped); !errors.Is(err, outbox.ErrInsertOrder) {
			t.Errorf("B/order after order/B: %v, want ErrInsertOrder", err)
		}
		return errors.New("roll back")
	}); err == nil {
		t.Fatal("want the rollback")
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback()
	if _, err := w.InsertSQLTx(ctx, stx, ev("Y")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertSQLTx(ctx, stx, ev("X")); !errors.Is(err, outbox.ErrInsertOrder) {
		t.Fatalf("database/sql: X after Y: %v, want ErrInsertOrder", err)
	}
	if _, err := w.InsertSQLTx(ctx, stx, ev("X"), ev("W")); !errors.Is(err, outbox.ErrInsertOrder) {
		t.Fatalf("database/sql: X and W after Y: %v, want ErrInsertOrder", err)
	}
	if _, err := w.InsertSQLTx(ctx, stx, ev("Z")); err != nil {
		t.Fatal(err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func waitsOnLock(t *testing.T, pool *pgxpool.Pool, pid uint32) bool {
	t.Helper()
	var waiting bool
	err := pool.QueryRow(context.Background(), `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
	return err == nil && waiting
}

func isDeadlock(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "40P01"
}
