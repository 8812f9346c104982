package outboxcdc_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// Example wires a CDC relay: one outbox.Relay that publishes what the
// stream reads, another (with ReconcileAfter) as its polling safety net.
// It needs a server with wal_level=logical, so it is compiled, not run.
func Example() {
	ctx := context.Background()
	url := "postgres://relay@db.internal:5432/shop"
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	var pub outbox.Publisher // outboxnats.NewPublisher(...), outboxkafka.NewPublisher(...), ...
	stream, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, ID: "shop-1-cdc", DisableNotify: true})
	if err != nil {
		log.Fatal(err)
	}
	net, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, ID: "shop-1", ReconcileAfter: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outboxcdc.New(outboxcdc.Config{DatabaseURL: url, Pool: pool, Relay: stream, SafetyNet: net})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil { // until ctx ends
		log.Fatal(err)
	}
}
