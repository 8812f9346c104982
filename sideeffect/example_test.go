package sideeffect_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/sideeffect"
)

// A payments consumer charges a card once per OrderCreated event. The
// provider honours idempotency keys; the first call times out after the
// provider charged, the retry (the event's redelivery) reuses the key and
// gets the first charge back.
func ExampleCaller_Do() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "example_sideeffect_" + uuid.NewString()[:8]
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck

	// The provider: charges once per key, and loses its first response.
	charges := map[string]string{}
	lost := 1
	charge := func(ctx context.Context, key string) ([]byte, error) {
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf(`{"charge":"ch_%d"}`, len(charges)+1)
		}
		if lost > 0 {
			lost--
			return nil, errors.New("read tcp: i/o timeout") // ambiguous: it may have charged
		}
		return []byte(charges[key]), nil
	}

	payments, err := sideeffect.New(pool, sideeffect.Config{Name: "payments.charge", Schema: schema, Mode: sideeffect.Idempotent})
	if err != nil {
		log.Fatal(err)
	}
	eventID := "0b5e6f5e-1c1f-4a53-9d2e-4f0d5b6f7a10" // the OrderCreated event's id
	request := []byte(`{"order":"o-1","amount":1299,"currency":"EUR"}`)
	for delivery := 1; delivery <= 3; delivery++ {
		res, err := payments.Do(ctx, eventID, request, charge)
		switch {
		case errors.Is(err, sideeffect.ErrUnknown):
			fmt.Printf("delivery %d: outcome unknown, not acked: the event comes back\n", delivery)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Printf("delivery %d: %s %s (called: %v, attempts: %d)\n", delivery, res.State, res.Response, res.Called, res.Attempts)
		}
	}
	fmt.Println("charges at the provider:", len(charges))
	// Output:
	// delivery 1: outcome unknown, not acked: the event comes back
	// delivery 2: succeeded {"charge":"ch_1"} (called: true, attempts: 2)
	// delivery 3: succeeded {"charge":"ch_1"} (called: false, attempts: 2)
	// charges at the provider: 1
}
