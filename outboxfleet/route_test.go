package outboxfleet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// TestFleetRoutesByAggregateType: sources with routes send each aggregate
// type to its destination (two real JetStream streams): invoices to
// billing, every other type to events; each aggregate's events all reach
// the one destination of its type, in sequence order. In a source whose
// routes name no fallback, an event of an unrouted type is quarantined with
// the reason, and the routed ones go on.
func TestFleetRoutesByAggregateType(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "r")
	schemas := []string{prefix + "_a", prefix + "_b", prefix + "_c"}
	strict := prefix + "_strict"
	migrateSchemas(t, admin, append(schemas, strict)...)
	events, billing := newStream(t), newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 2s}
databases:
  main: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
  billing: {url: "nats://unused"}
sources:
  - database: main
    schema: %s
    routes:
      - {aggregate_types: [invoice], destination: billing}
  - database: main
    schema_pattern: "%s_?"
    routes:
      - {aggregate_types: [invoice], destination: billing}
      - {destination: events}
`, outboxtest.DatabaseURL(), strict, prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": events.pub, "billing": billing.pub})})
	waitFor(t, 60*time.Second, "4 sources running", func() bool { return len(running(f)) == 4 })
	var w written
	for _, s := range schemas {
		w.write(t, admin, s, "invoice", 4, 5)
		w.write(t, admin, s, "order", 4, 5)
		w.write(t, admin, s, "customer", 2, 3)
	}
	var strictW written
	strictW.write(t, admin, strict, "invoice", 2, 3)
	strictW.write(t, admin, strict, "order", 1, 1)
	waitFor(t, 120*time.Second, "every routed event published", func() bool { return unpublishedIn(t, admin, schemas...) == 0 })
	waitFor(t, 60*time.Second, "strict: invoices published, the order quarantined", func() bool {
		var pending, quarantined int
		if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL AND quarantined_at IS NULL),
	count(*) FILTER (WHERE quarantined_at IS NOT NULL AND aggregate_type = 'order' AND last_error LIKE '%has no route%')
FROM `+strict+`.outbox_events`).Scan(&pending, &quarantined); err != nil {
			t.Fatal(err)
		}
		return pending == 0 && quarantined == 1
	})
	w.checkDelivered(t, billing.messages(t), func(typ string) bool { return typ == "invoice" })
	w.checkDelivered(t, events.messages(t), func(typ string) bool { return typ != "invoice" })
}
