package outboxconsole_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fixture is a schema with published events, quarantined ones with events
// blocked behind them, a running relay and an inbox consumer with an
// aggregate waiting on a gap.
type fixture struct {
	pool   *pgxpool.Pool
	schema string
	admin  *outbox.Admin
	// quarantined are the quarantined events, oldest quarantine first.
	quarantined []uuid.UUID
	// refuse holds the aggregate ids the destination refuses; delete one to
	// let a retry through.
	refuse *sync.Map
}

// refusedPayload is the payload of the refused events: markup that must be
// shown escaped.
const refusedPayload = `{"note":"<script>alert('x')</script>","amount_cents":1299,"currency":"EUR"}`

// newFixture writes okAggregates aggregates of perAggregate events, which
// the relay publishes, and badAggregates more whose first event the
// destination refuses permanently (quarantined, with perAggregate-1 events
// blocked behind each).
func newFixture(t testing.TB, okAggregates, badAggregates, perAggregate int) *fixture {
	t.Helper()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	if os.Getenv("OUTBOX_CONSOLE_SCREENSHOT") != "" && t.Name() == "TestConsoleInBrowser" {
		// The README's screenshot shows a schema named like a real one.
		pool, schema = outboxtest.SchemaNamed(t, "shop")
	}
	f := &fixture{pool: pool, schema: schema, refuse: &sync.Map{}}
	var err error
	if f.admin, err = outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var evs []outbox.Event
	for a := range okAggregates {
		for s := range perAggregate {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("ord-%04d", a), Type: []string{"OrderCreated", "OrderPaid", "OrderShipped"}[s%3],
				Payload: fmt.Appendf(nil, `{"order_id":"ord-%04d","step":%d}`, a, s)})
		}
	}
	for a := range badAggregates {
		id := fmt.Sprintf("pay-%04d", a)
		f.refuse.Store(id, true)
		for s := range perAggregate {
			p := []byte(refusedPayload)
			if s > 0 {
				p = fmt.Appendf(nil, `{"payment_id":"%s","step":%d}`, id, s)
			}
			evs = append(evs, outbox.Event{AggregateType: "payment", AggregateID: id, Type: "PaymentCaptured", Payload: p})
		}
	}
	for len(evs) > 0 {
		n := min(len(evs), 500)
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, evs[:n]...); return err }); err != nil {
			t.Fatal(err)
		}
		evs = evs[n:]
	}
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			if _, bad := f.refuse.Load(m.AggregateID); bad {
				errs[i] = outbox.Permanent(errors.New("422 from payments: currency EUR not enabled for merchant <acme>"))
			}
		}
		return errs
	})
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 20 * time.Millisecond,
		RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond, Logger: discard(),
		HeartbeatInterval: 200 * time.Millisecond}) // its health (readiness) recorded soon after its first batch
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	outboxtest.Eventually(t, 60*time.Second, "the good events published, the bad heads quarantined", func() bool {
		st, err := f.admin.Status(ctx)
		return err == nil && st.Quarantined == int64(badAggregates) && st.Pending == int64(badAggregates*(perAggregate-1)) && st.Leased == 0
	})
	q, err := f.admin.ListQuarantined(ctx, outbox.QuarantineFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range q {
		f.quarantined = append(f.quarantined, e.ID)
	}
	return f
}

// waitOnGap makes consumer receive sequence 2 of an aggregate before 1, so
// that the aggregate waits on a gap.
func (f *fixture) waitOnGap(t testing.TB, consumer, aggregateID string) {
	t.Helper()
	in, err := inbox.New(f.pool, inbox.Config{Consumer: consumer, Schema: f.schema})
	if err != nil {
		t.Fatal(err)
	}
	out, err := in.Handle(context.Background(), outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: aggregateID, Sequence: 2, Type: "OrderPaid", Payload: []byte(`{}`)},
		func(context.Context, pgx.Tx) error { return nil })
	if err != nil || out != inbox.Early {
		t.Fatalf("deliver #2 first to %s: %v, %v; want early", consumer, out, err)
	}
}

// spreadPublished moves the published events' published_at over the last
// hour, and their occurred_at to 20 ms to half a second before, so that the
// charts have an hour of history.
func (f *fixture) spreadPublished(t testing.TB) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), `UPDATE `+f.schema+`.outbox_events e
SET published_at = v.at, occurred_at = v.at - make_interval(secs => 0.02 + (hashtext(e.event_id::text) & 1023) / 2000.0)
FROM (SELECT event_id, now() - make_interval(secs => 3590 * power((hashtext(event_id::text) & 65535) / 65536.0, 1.6)) AS at
	FROM `+f.schema+`.outbox_events WHERE published_at IS NOT NULL AND skipped_at IS NULL) v
WHERE e.event_id = v.event_id`); err != nil {
		t.Fatal(err)
	}
}
