package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

func newWriter(t *testing.T, schema string) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func countEvents(t testing.TB, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".outbox_events").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func orderEvent(id, typ string) outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: id, Type: typ, Payload: []byte(`{"order_id":"` + id + `"}`)}
}

func TestInsertTxCommitAndRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)

	// I1: a committed transaction leaves exactly one intent per event, with
	// consecutive sequences in the order given.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := w.InsertTx(ctx, tx, orderEvent("o1", "OrderCreated"), orderEvent("o1", "OrderPaid"), orderEvent("o2", "OrderCreated"), orderEvent("o1", "OrderShipped"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantSeq := []int64{1, 2, 1, 3}
	for i, r := range recs {
		if r.Sequence != wantSeq[i] {
			t.Errorf("event %d: sequence %d, want %d", i, r.Sequence, wantSeq[i])
		}
		if r.ID.Version() != 7 {
			t.Errorf("event %d: id %s is not a UUIDv7", i, r.ID)
		}
	}
	rows, err := pool.Query(ctx, "SELECT event_id, event_type, aggregate_sequence FROM "+schema+".outbox_events WHERE aggregate_id = 'o1' ORDER BY aggregate_sequence")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var id uuid.UUID
		var typ string
		var seq int64
		err := r.Scan(&id, &typ, &seq)
		return fmt.Sprintf("%s:%s:%d", id, typ, seq), err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{recs[0].ID.String() + ":OrderCreated:1", recs[1].ID.String() + ":OrderPaid:2", recs[3].ID.String() + ":OrderShipped:3"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("stored o1 events %v, want %v", got, want)
	}

	// I2: a rolled-back transaction leaves no intent and no sequence use.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertTx(ctx, tx, orderEvent("o1", "OrderCancelled"), orderEvent("o3", "OrderCreated")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countEvents(t, pool, schema); n != 4 {
		t.Fatalf("after rollback: %d events, want 4", n)
	}
	tx, _ = pool.Begin(ctx)
	recs, err = w.InsertTx(ctx, tx, orderEvent("o1", "OrderCancelled"))
	if err != nil {
		t.Fatal(err)
	}
	_ = tx.Commit(ctx)
	if recs[0].Sequence != 4 {
		t.Fatalf("sequence after a rolled-back write: %d, want 4 (no gap)", recs[0].Sequence)
	}
}

func TestInsertSQLTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	insert := func(commit bool, events ...outbox.Event) []outbox.Recorded {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := w.InsertSQLTx(ctx, tx, events...)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	recs := insert(true, orderEvent("a", "OrderCreated"), orderEvent("a", "OrderPaid"))
	if recs[0].Sequence != 1 || recs[1].Sequence != 2 {
		t.Fatalf("sequences %d,%d, want 1,2", recs[0].Sequence, recs[1].Sequence)
	}
	insert(false, orderEvent("a", "OrderShipped"))
	if n := countEvents(t, pool, schema); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
	var payload string
	if err := db.QueryRowContext(ctx, "SELECT convert_from(payload_bytes, 'UTF8') FROM "+schema+".outbox_events WHERE event_id = $1", recs[1].ID).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if payload != `{"order_id":"a"}` { // exactly as written
		t.Fatalf("payload %s", payload)
	}
	var _ *sql.Tx // the database/sql path is what sqlx, GORM, bun and ent hand out
}

func TestConcurrentWritersOneAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	const writers, perWriter = 20, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < perWriter; j++ {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := w.InsertTx(ctx, tx, orderEvent("hot", fmt.Sprintf("W%dE%d", i, j)))
					if err != nil {
						return err
					}
					if j%3 == 2 { // every third transaction rolls back
						return errRollback
					}
					return nil
				})
				if err != nil && !errors.Is(err, errRollback) {
					errs <- err
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var n, min, max, distinct int64
	if err := pool.QueryRow(ctx, "SELECT count(*), min(aggregate_sequence), max(aggregate_sequence), count(DISTINCT aggregate_sequence) FROM "+schema+".outbox_events").Scan(&n, &min, &max, &distinct); err != nil {
		t.Fatal(err)
	}
	committed := int64(writers * (perWriter - perWriter/3))
	if n != committed || distinct != n || min != 1 || max != n {
		t.Fatalf("%d events (want %d), sequences %d..%d with %d distinct: want unique and gap-free 1..%d", n, committed, min, max, distinct, committed)
	}
}

var errRollback = errors.New("rollback on purpose")

func TestInsertTxRefusesBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema, MaxPayloadBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	good := orderEvent("o", "OrderCreated")
	cases := map[string]struct {
		ev   outbox.Event
		want string
	}{
		"empty aggregate type": {outbox.Event{AggregateID: "o", Type: "T", Payload: []byte(`{}`)}, "aggregate type is empty"},
		"empty aggregate id":   {outbox.Event{AggregateType: "order", Type: "T", Payload: []byte(`{}`)}, "aggregate id is empty"},
		"empty event type":     {outbox.Event{AggregateType: "order", AggregateID: "o", Payload: []byte(`{}`)}, "event type is empty"},
		"invalid JSON":         {outbox.Event{AggregateType: "order", AggregateID: "o", Type: "T", Payload: []byte(`{"a":`)}, "not valid JSON"},
		"empty payload":        {outbox.Event{AggregateType: "order", AggregateID: "o", Type: "T"}, "payload is empty"},
		"payload over limit":   {outbox.Event{AggregateType: "order", AggregateID: "o", Type: "T", Payload: []byte(`"` + strings.Repeat("x", 80) + `"`)}, "over the 64-byte limit"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			// The good event comes first: nothing of the call may be written.
			_, err = w.InsertTx(ctx, tx, good, c.ev)
			if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want ErrInvalidEvent saying %q", err, c.want)
			}
			var n int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_events").Scan(&n); err != nil {
				t.Fatalf("transaction unusable after refused input: %v", err)
			}
			if n != 0 {
				t.Fatalf("%d events written", n)
			}
		})
	}
	if _, err := outbox.NewWriter(outbox.WriterConfig{Schema: `x"; DROP TABLE y; --`}); err == nil {
		t.Fatal("an invalid schema name was accepted")
	}
	if _, err := outbox.NewWriter(outbox.WriterConfig{Schema: "s", MaxPayloadBytes: -1}); err == nil {
		t.Fatal("a negative payload limit was accepted")
	}
}

func TestNullPayloadAndHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	ev := outbox.Event{AggregateType: "order", AggregateID: "o", Type: "Ping", SchemaVersion: 3, Payload: []byte(`null`),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	var recs []outbox.Recorded
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		recs, err = w.InsertTx(ctx, tx, ev)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var payload, tp string
	var version int
	if err := pool.QueryRow(ctx, "SELECT convert_from(payload_bytes, 'UTF8'), headers->>'traceparent', schema_version FROM "+schema+".outbox_events WHERE event_id = $1", recs[0].ID).Scan(&payload, &tp, &version); err != nil {
		t.Fatal(err)
	}
	if payload != "null" || tp != ev.Headers["traceparent"] || version != 3 {
		t.Fatalf("stored payload %s, traceparent %q, version %d", payload, tp, version)
	}
}
