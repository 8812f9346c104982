package outboxfleet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// TestFleetManySchemasAddedAndDropped: 50 schemas matched by one pattern
// under one fleet, on one pool of 6 connections and one LISTEN connection.
// Every event is delivered to a real JetStream stream in per-aggregate
// order; a schema created (and migrated) while the fleet runs is found and
// served; a schema dropped while it runs is retired, and the others go on.
// Half the writers notify (the shared LISTEN wakes their source), half do
// not (the look finds their events).
func TestFleetManySchemasAddedAndDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "f")
	const n = 50
	var schemas []string
	for i := 0; i < n; i++ {
		schemas = append(schemas, fmt.Sprintf("%s_%02d", prefix, i))
	}
	migrateSchemas(t, admin, schemas...)
	st := newStream(t)
	app := "fleet " + prefix
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay:
  poll_interval: 50ms
  discover_interval: 200ms
  idle_max: 2s
databases:
  main:
    url: %q
    max_conns: 6
destinations:
  events:
    url: nats://unused
sources:
  - database: main
    schema_pattern: "%s_*"
    destination: events
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{
		OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub}),
		ConfigurePool:   func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app },
	})
	waitFor(t, 3*time.Minute, "50 sources running", func() bool { return len(running(f)) == n })

	var w written
	notifiers := map[string]*outbox.Notifier{}
	for i, s := range schemas {
		w.write(t, admin, s, "order", 3, 2)
		if i%2 == 0 {
			nt, err := outbox.NewNotifier(admin, outbox.NotifierConfig{Schema: s, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nt.Close)
			notifiers[s] = nt
			nt.Notify()
		}
	}
	waitFor(t, 120*time.Second, "first events published", func() bool { return unpublishedIn(t, admin, schemas...) == 0 })

	// One pool of 6, one LISTEN connection and the look's for the 50
	// sources.
	var backends int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&backends); err != nil {
		t.Fatal(err)
	}
	if backends > 8 || backends < 1 {
		t.Fatalf("%d connections of the fleet: want at most 6 in the pool, 1 listening and 1 looking", backends)
	}
	var listeners int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`, app).Scan(&listeners); err != nil {
		t.Fatal(err)
	}
	if listeners != 1 {
		t.Fatalf("%d listening connections: want 1 for the database", listeners)
	}

	// Drop one schema, add one, while the fleet runs.
	dropped := schemas[7]
	if _, err := admin.Exec(ctx, "DROP SCHEMA "+dropped+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	added := fmt.Sprintf("%s_%02d", prefix, n)
	migrateSchemas(t, admin, added)
	live := append(append(append([]string(nil), schemas[:7]...), schemas[8:]...), added)
	waitFor(t, 3*time.Minute, "the dropped schema retired and the new one served", func() bool {
		r := running(f)
		return !r[dropped] && r[added] && len(r) == n
	})
	for _, s := range live {
		w.write(t, admin, s, "order", 3, 2)
		if nt := notifiers[s]; nt != nil {
			nt.Notify()
		}
	}
	waitFor(t, 120*time.Second, "every event published", func() bool { return unpublishedIn(t, admin, live...) == 0 })
	msgs := st.messages(t)
	w.checkDelivered(t, msgs, nil)
	if got, want := len(msgs), w.len(); got != want {
		t.Logf("%d messages for %d events (duplicates are allowed)", got, want)
	}
	waitFor(t, 30*time.Second, "the fleet ready", func() bool { return f.Ready() == nil })
	for _, s := range f.Sources() {
		if s.Schema == dropped {
			t.Fatalf("the dropped schema is still listed: %+v", s)
		}
	}
	if strings.Contains(fmt.Sprint(f.Ready()), dropped) {
		t.Fatal("the dropped schema is named by Ready")
	}
}
