package outbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// exampleSchema gives an example a fresh schema of its own and a function
// that drops it.
func exampleSchema(ctx context.Context) (*pgxpool.Pool, string, func()) {
	pool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	schema := "example_" + fmt.Sprint(uniqueSuffix())
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	return pool, schema, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}
}

// Record an order and its events in one transaction. The events exist
// exactly when the order does, with consecutive sequences per aggregate.
func ExampleWriter_InsertTx() {
	ctx := context.Background()
	pool, schema, drop := exampleSchema(ctx)
	defer drop()

	writer, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id text PRIMARY KEY, total int)"); err != nil {
		log.Fatal(err)
	}
	var recorded []outbox.Recorded
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".orders VALUES ('ord-1', 42)"); err != nil {
			return err
		}
		recorded, err = writer.InsertTx(ctx, tx,
			outbox.Event{AggregateType: "order", AggregateID: "ord-1", Type: "OrderCreated", Payload: []byte(`{"total":42}`)},
			outbox.Event{AggregateType: "order", AggregateID: "ord-1", Type: "OrderConfirmed", Payload: []byte(`{}`)},
		)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range recorded {
		fmt.Println("sequence", r.Sequence)
	}
	// Output:
	// sequence 1
	// sequence 2
}

// Invalid events are refused before anything is written.
func ExampleWriter_InsertTx_invalid() {
	writer, _ := outbox.NewWriter(outbox.WriterConfig{})
	_, err := writer.InsertTx(context.Background(), nil,
		outbox.Event{AggregateType: "order", AggregateID: "ord-1", Type: "OrderCreated", Payload: []byte(`{"total":`)})
	fmt.Println(err)
	// Output:
	// invalid event 0: payload: not valid JSON
}
