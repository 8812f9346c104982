package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgident"
	"go.opentelemetry.io/otel/trace"
)

// Micro-benchmarks of the relay's and the writer's hot paths. Those that
// talk to PostgreSQL need it at DATABASE_URL, like the tests. The end-to-end
// figures come from the bench module (cd bench && go run .).

// BenchmarkRelaySQLBuild measures building the relay's statements for a
// schema (done once per relay).
func BenchmarkRelaySQLBuild(b *testing.B) {
	s, err := pgident.NewSchema("outbox_bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = newRelaySQL(s, BatchSizeDefault)
	}
}

// loadPending inserts n pending events over aggs aggregates, the way the
// writer leaves them.
func loadPending(b *testing.B, ctx context.Context, db *pgxpool.Pool, schema string, n, aggs int) {
	b.Helper()
	_, err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s.outbox_events (event_id, aggregate_type, aggregate_id,
	aggregate_sequence, event_type, payload, occurred_at, available_at)
SELECT gen_random_uuid(), 'order', 'o-' || (i %% %[2]d), i / %[2]d + 1, 'OrderUpdated', '{"n":1}',
	now() - interval '1 hour' + i * interval '1 microsecond', now() - interval '1 hour' + i * interval '1 microsecond'
FROM generate_series(0, %[3]d - 1) AS i`, schema, aggs, n))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(ctx, "VACUUM (ANALYZE) "+schema+".outbox_events"); err != nil {
		b.Fatal(err)
	}
}

var errRollback = errors.New("roll back")

// BenchmarkClaim measures one claim round trip of BatchSizeDefault events
// from a 20,000-event backlog, in a transaction rolled back after each
// claim so that every iteration sees the same table. "heads" has one event
// per aggregate in the batch; "lanes" has 10 aggregates, so the claim fills
// the batch with each lane's contiguous successors.
func BenchmarkClaim(b *testing.B) {
	for _, tc := range []struct {
		name string
		aggs int
	}{{"heads", 10_000}, {"lanes", 10}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			pool, schema := outboxtest.Schema(b)
			loadPending(b, ctx, pool, schema, 20_000, tc.aggs)
			s, _ := pgident.NewSchema(schema)
			q := newRelaySQL(s, BatchSizeDefault)
			b.ReportAllocs()
			b.ResetTimer()
			events := 0
			for b.Loop() {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					rows, err := tx.Query(ctx, q.claim, BatchSizeDefault, "bench", uuid.New(), 30_000)
					if err != nil {
						return err
					}
					for rows.Next() {
						events++
					}
					if err := rows.Err(); err != nil {
						return err
					}
					return errRollback
				})
				if err != nil && err != errRollback {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(events)/float64(b.N), "events/op")
		})
	}
}

// BenchmarkInsertTx measures Writer.InsertTx in a transaction of its own
// (BEGIN, insert, COMMIT), for one event (the typed fast path) and for ten
// events of two aggregates (the general statement).
func BenchmarkInsertTx(b *testing.B) {
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			ctx := context.Background()
			pool, schema := outboxtest.Schema(b)
			w, err := NewWriter(WriterConfig{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
			payload := []byte(`{"order_id":"o-1","customer_id":"c-42","items":[{"sku":"sku-1","quantity":2}],"total_cents":12345}`)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				evs := make([]Event, n)
				for j := range evs {
					evs[j] = Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d-%d", i, j%2), Type: "OrderCreated", Payload: payload}
				}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := w.InsertTx(ctx, tx, evs...)
					return err
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPrepare measures the writer's client-side work for one event
// (validation, id, parameters) without the database.
func BenchmarkPrepare(b *testing.B) {
	w, err := NewWriter(WriterConfig{})
	if err != nil {
		b.Fatal(err)
	}
	ev := Event{AggregateType: "order", AggregateID: "o-1", Type: "OrderCreated",
		Payload: []byte(`{"order_id":"o-1","customer_id":"c-42","items":[{"sku":"sku-1","quantity":2}],"total_cents":12345}`)}
	b.Run("one", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := w.prepareOne(&ev, traceContext{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("general", func(b *testing.B) {
		b.ReportAllocs()
		evs := []Event{ev}
		for b.Loop() {
			if _, _, _, err := w.prepare(evs, traceContext{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-traced", func(b *testing.B) {
		// The caller's context carries a span: the event gets a traceparent.
		tc := w.traceContext(trace.ContextWithSpanContext(context.Background(), testSpanContext()))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := w.prepareOne(&ev, tc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
