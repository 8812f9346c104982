package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"math"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
