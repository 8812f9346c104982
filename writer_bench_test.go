package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// handWrittenInsertSQL is the statement Writer.InsertTx ran for one event
// before it went through the SQL write API (migration 011): the counter
// upsert and the event insert with typed parameters, as one would write
// them by hand. BenchmarkWritePath measures the writer against it.
func handWrittenInsertSQL(s pgident.Schema) string {
	held := `'[' || to_json('` + s.Name() + `' || chr(31) || $2::text || chr(31) || $3::text)::text || ']'`
	return `WITH seq AS (
	INSERT INTO ` + s.Table("outbox_aggregates") + ` AS a (aggregate_type, aggregate_id, last_sequence)
	SELECT $2, $3, 1
	WHERE CASE WHEN coalesce(current_setting('outbox.wrote', true), '') = ''
		THEN set_config('outbox.wrote', ` + held + `, true) IS NOT NULL ELSE false END
	ON CONFLICT (aggregate_type, aggregate_id)
	DO UPDATE SET last_sequence = a.last_sequence + 1,
		parked_through = CASE WHEN a.parked_through = a.last_sequence THEN a.last_sequence + 1 ELSE a.parked_through END
	RETURNING a.last_sequence, a.parked_at
)
INSERT INTO ` + s.Table("outbox_events") + ` (event_id, aggregate_type, aggregate_id,
	aggregate_sequence, event_type, schema_version, payload_bytes, headers, content_type, available_at)
SELECT $1::uuid, $2::text, $3::text, seq.last_sequence, $4::text, $5::int, $6::bytea, $7::text::jsonb, $8::text,
	CASE WHEN seq.parked_at IS NULL THEN now() ELSE 'infinity'::timestamptz END FROM seq
RETURNING event_id, aggregate_sequence, occurred_at`
}

// BenchmarkWritePath alternates, transaction by transaction on one
// connection (BEGIN, the write, COMMIT; synchronous_commit off, so that the
// WAL flush does not drown the difference), three ways to write one event
// (or ten, over two aggregates): the hand-written statement the writer ran
// before migration 011 ("hand"), Writer.InsertTx, which now calls
// enqueue/enqueue_many ("writer"), and enqueue called directly as another
// language would ("sql"). It reports each one's mean µs per event.
func BenchmarkWritePath(b *testing.B) {
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			ctx := context.Background()
			pool, schema := outboxtest.Schema(b)
			s, _ := pgident.NewSchema(schema)
			w, err := NewWriter(WriterConfig{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
			conn, err := pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
				b.Fatal(err)
			}
			payload := []byte(`{"order_id":"o-1","customer_id":"c-42","items":[{"sku":"sku-1","quantity":2}],"total_cents":12345}`)
			hand, sqlOne := handWrittenInsertSQL(s), `SELECT * FROM `+s.Quoted()+`.enqueue($1, $2, $3, $4::bytea)`
			sqlMany := `SELECT * FROM ` + s.Quoted() + `.enqueue_many($1::jsonb)`
			var spent [3]time.Duration
			i := 0
			for b.Loop() {
				i++
				for way := range 3 {
					start := time.Now()
					err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
						id := func(j int) string { return fmt.Sprintf("o-%d-%d-%d", way, i, j%2) }
						switch {
						case way == 0:
							for j := range n {
								if _, err := tx.Exec(ctx, hand, uuid.Must(uuid.NewV7()).String(), "order", id(j), "OrderCreated", 1, payload, "{}", nil); err != nil {
									return err
								}
							}
							return nil
						case way == 1:
							evs := make([]Event, n)
							for j := range evs {
								evs[j] = Event{AggregateType: "order", AggregateID: id(j), Type: "OrderCreated", Payload: payload}
							}
							_, err := w.InsertTx(ctx, tx, evs...)
							return err
						case n == 1:
							_, err := tx.Exec(ctx, sqlOne, "order", id(0), "OrderCreated", payload)
							return err
						default:
							doc := "["
							for j := range n {
								if j > 0 {
									doc += ","
								}
								doc += fmt.Sprintf(`{"aggregate_type":"order","aggregate_id":%q,"event_type":"OrderCreated","payload":%s}`, id(j), payload)
							}
							_, err := tx.Exec(ctx, sqlMany, doc+"]")
							return err
						}
					})
					if err != nil {
						b.Fatal(err)
					}
					spent[way] += time.Since(start)
				}
			}
			per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(i*n) }
			b.ReportMetric(per(spent[0]), "µs/event-hand")
			b.ReportMetric(per(spent[1]), "µs/event-writer")
			b.ReportMetric(per(spent[2]), "µs/event-sql")
		})
	}
}
