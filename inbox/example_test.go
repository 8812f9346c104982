package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"math"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// A payload changed shape: OrderPlaced v1 had "total" in euros as a JSON
// number, v2 has integer "total_cents" and a currency. The consumer's code only
// knows v2; an upcaster upgrades old events (still in the outbox, or
// replayed) before the effect sees them.
func ExampleUpcasters() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "example_upcast_" + uuid.NewString()[:8]
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck

	var up inbox.Upcasters
	up.MustRegister("OrderPlaced", 1, func(payload []byte) ([]byte, error) {
		var v1 struct {
			Total float64 `json:"total"`
		}
		if err := json.Unmarshal(payload, &v1); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]any{"total_cents": int64(math.Round(v1.Total * 100)), "currency": "EUR"})
	})
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "reporting", Upcasters: &up})
	if err != nil {
		log.Fatal(err)
	}

	deliveries := []outbox.Message{
		{ID: uuid.New(), AggregateType: "order", AggregateID: "o-1", Sequence: 1, Type: "OrderPlaced",
			SchemaVersion: 1, Payload: []byte(`{"total":12.99}`)},
		{ID: uuid.New(), AggregateType: "order", AggregateID: "o-1", Sequence: 2, Type: "OrderPlaced",
			SchemaVersion: 2, Payload: []byte(`{"currency":"EUR","total_cents":1350}`)},
	}
	for _, m := range deliveries {
		outcome, err := in.HandleMessage(ctx, m, func(ctx context.Context, tx pgx.Tx, m outbox.Message) error {
			fmt.Printf("effect got v%d %s\n", m.SchemaVersion, m.Payload)
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome)
	}
	// Output:
	// effect got v2 {"currency":"EUR","total_cents":1299}
	// applied
	// effect got v2 {"currency":"EUR","total_cents":1350}
	// applied
}

// exampleSchema migrates a schema of its own for an example; drop it with
// the returned function.
func exampleSchema(ctx context.Context, prefix string) (*pgxpool.Pool, string, func()) {
	pool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	schema := prefix + "_" + uuid.NewString()[:8]
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	return pool, schema, func() {
		pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
		pool.Close()
	}
}

// A consumer deployed long after the producer: the stream's retention
// dropped the first events of order o-1, so the consumer sees #7 first.
// Strict (the default), it would refuse #7 as early forever; with
// StartAtFirstSeen it starts the aggregate there and records that it did.
// (These messages carry no time, so they count as from before the
// consumer's start point; an event of an aggregate created after it would
// wait for the aggregate's sequence 1.)
func ExampleConfig_startAtFirstSeen() {
	ctx := context.Background()
	pool, schema, drop := exampleSchema(ctx, "example_first_seen")
	defer drop()

	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "analytics",
		StartAtFirstSeen: true, StartReason: "analytics deployed 2026-12-01; earlier orders not needed"})
	if err != nil {
		log.Fatal(err)
	}
	for _, seq := range []int64{7, 6, 8} {
		m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o-1", Sequence: seq, Type: "OrderUpdated"}
		outcome, err := in.Handle(ctx, m, func(ctx context.Context, tx pgx.Tx) error { return nil })
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("#%d %s\n", seq, outcome)
	}
	admin, err := inbox.NewAdmin(pool, inbox.AdminConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	a, err := admin.Aggregate(ctx, "analytics", "order", "o-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("mark %d; start %s: #%d..#%d never applied (%s)\n", a.LastSequence, a.Start.Kind, a.Start.PriorMark+1, a.Start.Mark, a.Start.Reason)
	// Output:
	// #7 applied
	// #6 duplicate
	// #8 applied
	// mark 8; start first_seen: #1..#6 never applied (analytics deployed 2026-12-01; earlier orders not needed)
}

// A consumer restores its read model from a snapshot taken when order o-1
// was at sequence 41, and seeds the inbox's mark in the same transaction, so
// that the state and the mark commit together. Deliveries up to #41 are then
// duplicates and #42 is applied.
func ExampleInbox_SeedTx() {
	ctx := context.Background()
	pool, schema, drop := exampleSchema(ctx, "example_seed")
	defer drop()

	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "search"})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... restore the snapshot's rows through tx ...
		return in.SeedTx(ctx, tx, "order", "o-1", 41, "restored from snapshot 2026-12-01T00:00Z")
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, seq := range []int64{41, 43, 42} {
		m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o-1", Sequence: seq, Type: "OrderUpdated"}
		outcome, err := in.Handle(ctx, m, func(ctx context.Context, tx pgx.Tx) error { return nil })
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("#%d %s\n", seq, outcome)
	}
	// Output:
	// #41 duplicate
	// #43 early
	// #42 applied
}

// A consumer built on database/sql (sqlx, GORM, bun, ent): NewSQL takes its
// *sql.DB, and the effect runs in the delivery's *sql.Tx, which sqlx wraps
// as &sqlx.Tx{Tx: tx} and GORM opens with
// gorm.Open(postgres.New(postgres.Config{Conn: tx})). The pgx stdlib driver
// here; any PostgreSQL driver does.
func ExampleInbox_HandleSQL() {
	ctx := context.Background()
	pool, schema, drop := exampleSchema(ctx, "example_sql")
	defer drop()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+schema+".stock (sku text PRIMARY KEY, reserved int NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	in, err := inbox.NewSQL(db, inbox.Config{Tables: outbox.Schema(schema), Consumer: "inventory"})
	if err != nil {
		log.Fatal(err)
	}
	m := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o-1", Sequence: 1, Type: "OrderCreated"}
	for range 2 { // delivered twice: applied once
		outcome, err := in.HandleSQL(ctx, m, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO "+schema+".stock VALUES ('sku-1', 1) ON CONFLICT (sku) DO UPDATE SET reserved = stock.reserved + 1")
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome)
	}
	var reserved int
	if err := db.QueryRowContext(ctx, "SELECT reserved FROM "+schema+".stock").Scan(&reserved); err != nil {
		log.Fatal(err)
	}
	fmt.Println("reserved", reserved)
	// Output:
	// applied
	// duplicate
	// reserved 1
}
