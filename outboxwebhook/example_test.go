package outboxwebhook_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http/httptest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxwebhook"
)

// A made-up secret; generate yours with 32 random bytes in base64, e.g.
// "whsec_$(openssl rand -base64 32)".
const exampleSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// Example posts an event to a receiving service (here an httptest server
// running a Receiver), which verifies and decodes it.
func Example() {
	rc, err := outboxwebhook.NewReceiver([]string{exampleSecret}, func(ctx context.Context, m outbox.Message) error {
		fmt.Printf("received %s #%d of %s/%s: %s (traceparent %s)\n", m.Type, m.Sequence, m.AggregateType, m.AggregateID, m.Payload, m.Headers["traceparent"])
		return nil
	}, outboxwebhook.ReceiverOptions{})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(rc)
	defer srv.Close()

	// What "outbox relay --destination <url>" does with OUTBOX_WEBHOOK_SECRET set.
	cfg, err := outboxwebhook.ParseURL(srv.URL + "/events?outbox_timeout=5s&outbox_source=/shop")
	if err != nil {
		log.Fatal(err)
	}
	cfg.Secrets = []string{exampleSecret}
	p, err := outboxwebhook.NewPublisher(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	msg := outbox.Message{
		ID:            uuid.MustParse("0194a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
		AggregateType: "order",
		AggregateID:   "o-42",
		Sequence:      1,
		Type:          "OrderCreated",
		SchemaVersion: 1,
		Payload:       []byte(`{"total":1299}`),
		Headers:       map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		OccurredAt:    time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	if errs := p.Publish(context.Background(), []outbox.Message{msg}); errs != nil {
		fmt.Println(errs[0])
	}
	// Output:
	// received OrderCreated #1 of order/o-42: {"total":1299} (traceparent 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01)
}

// Example_inbox wires a Receiver to an inbox: each event's effect is applied
// once, in aggregate order, in one transaction with the inbox rows. An
// event that comes before its predecessor (Early) is answered 500, so the
// relay sends it again later; a duplicate is answered 204 without running
// the effect again.
func Example_inbox() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "example_webhook_" + uuid.NewString()[:8]
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}

	rc, err := outboxwebhook.NewReceiver([]string{exampleSecret}, func(ctx context.Context, m outbox.Message) error {
		outcome, err := in.Handle(ctx, m, func(ctx context.Context, tx pgx.Tx) error {
			fmt.Printf("bill %s #%d\n", m.AggregateID, m.Sequence) // the effect, through tx
			return nil
		})
		if err != nil {
			return err // 500: retried
		}
		if outcome == inbox.Early {
			return errors.New("an earlier event of this aggregate has not arrived yet") // 500: retried
		}
		return nil // Applied or Duplicate: 204
	}, outboxwebhook.ReceiverOptions{})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	p, err := outboxwebhook.NewPublisher(outboxwebhook.Config{URL: srv.URL, Secrets: []string{exampleSecret}})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	first := outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: "o-7", Sequence: 1, Type: "OrderPlaced",
		SchemaVersion: 1, Payload: []byte(`{}`), OccurredAt: time.Now()}
	second := first
	second.ID, second.Sequence = uuid.New(), 2
	for _, m := range []outbox.Message{second, first, first, second} {
		if errs := p.Publish(ctx, []outbox.Message{m}); errs != nil {
			fmt.Printf("#%d: retry later (%v)\n", m.Sequence, outbox.IsPermanent(errs[0]))
			continue
		}
		fmt.Printf("#%d: accepted\n", m.Sequence)
	}
	// Output:
	// #2: retry later (false)
	// bill o-7 #1
	// #1: accepted
	// #1: accepted
	// bill o-7 #2
	// #2: accepted
}
