package provider_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// A lost response after the charge committed: the caller cannot tell what
// happened, so it looks the key up (or retries with the same key) and gets
// the one charge, never a second.
func ExampleClient() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "provider_example_" + uuid.NewString()[:8]
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")

	svc, err := provider.New(pool, provider.Config{Schema: schema, Mode: provider.ModeIdempotent,
		Faults: provider.Faults{Seed: 1, Rules: []provider.Rule{{Fault: provider.FaultDropResponse, Next: 1}}}})
	if err != nil {
		log.Fatal(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	client := provider.NewClient(srv.URL, "", &http.Client{Timeout: 10 * time.Second})

	req := provider.ChargeRequest{Reference: "order-1", Amount: 2490, Currency: "eur"}
	_, err = client.Charge(ctx, "evt-1", req)
	fmt.Println("ambiguous:", errors.Is(err, provider.ErrAmbiguous))
	found, err := client.LookupByKey(ctx, "evt-1")
	fmt.Println("lookup:", found.Status, found.Amount, err)
	retry, err := client.Charge(ctx, "evt-1", req)
	fmt.Println("retry:", retry.Status, "replayed:", retry.Replayed, "same charge:", retry.ID == found.ID, err)
	ledger, err := client.Ledger(ctx, "order-1")
	fmt.Println("captured charges:", ledger.Totals[0].Charges, "duplicates:", ledger.Duplicates, err)
	// Output:
	// ambiguous: true
	// lookup: succeeded 2490 <nil>
	// retry: succeeded replayed: true same charge: true <nil>
	// captured charges: 1 duplicates: 0 <nil>
}
