package inbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// BenchmarkHandle measures one delivery through the inbox: the transaction
// that records (consumer, event_id), advances the aggregate's high-water
// mark and applies an effect of one INSERT. "new" delivers each aggregate's
// next event; "duplicate" delivers an event already applied.
func BenchmarkHandle(b *testing.B) {
	ctx := context.Background()
	pool, schema := outboxtest.Schema(b)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".effects (event_id uuid, seq bigint)"); err != nil {
		b.Fatal(err)
	}
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	effect := func(m outbox.Message) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+schema+".effects VALUES ($1, $2)", m.ID, m.Sequence)
			return err
		}
	}
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		var seq int64
		for b.Loop() {
			seq++
			m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o-new", Sequence: seq, Type: "T"}
			if out, err := in.Handle(ctx, m, effect(m)); err != nil || out != inbox.Applied {
				b.Fatalf("%v %v", out, err)
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o-dup", Sequence: 1, Type: "T"}
		if _, err := in.Handle(ctx, m, effect(m)); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if out, err := in.Handle(ctx, m, effect(m)); err != nil || out != inbox.Duplicate {
				b.Fatalf("%v %v", out, err)
			}
		}
	})
}
