package outboxfleet_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestAdvOneLockedSchemaStallsEveryIdleSource: docs/operations.md promises
// that events of a writer that does not notify go out "within
// poll_interval". The look that replaces the idle relays' own polls is one
// statement over every idle source of the database, so a lock on one
// tenant's outbox_events (an `outbox migrate` upgrade, an ALTER TABLE, a
// pg_repack of that tenant) blocks the look for all of them: another,
// untouched tenant's event waits until the lock goes (or idle_max), not
// poll_interval. Here the lock is held 20 s with poll_interval 50 ms and
// idle_max 60 s; tenant b's event must go out within 5 s.
func TestAdvOneLockedSchemaStallsEveryIdleSource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "lk")
	a, b := prefix+"_a", prefix+"_b"
	migrateSchemas(t, admin, a, b)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 60s}
databases:
  db: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: db, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 60*time.Second, "2 sources running", func() bool { return len(running(f)) == 2 })

	// Both sources publish once (so the fleet works), then go idle.
	var w written
	w.write(t, admin, a, "order", 1, 1)
	w.write(t, admin, b, "order", 1, 1)
	waitFor(t, 30*time.Second, "first events out", func() bool { return st.count(t) == 2 })

	// Tenant a's table is locked for 20 s (an upgrade in progress).
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+a+".outbox_events IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(20 * time.Second)
		_ = tx.Rollback(ctx)
	}()
	// The look (and tenant a's own claims) now queue behind the lock.
	waitFor(t, 10*time.Second, "a statement waiting on the lock", func() bool {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND NOT granted`,
			a+".outbox_events").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})

	// Tenant b, untouched, writes without notifying.
	start := time.Now()
	w.write(t, admin, b, "order", 1, 1)
	var releasedAt time.Time
	waitFor(t, 60*time.Second, "tenant b's event published at all", func() bool {
		select {
		case <-released:
			if releasedAt.IsZero() {
				releasedAt = time.Now()
			}
		default:
		}
		return st.count(t) >= 3
	})
	took := time.Since(start)
	if took > 5*time.Second {
		after := "before the lock went"
		if !releasedAt.IsZero() {
			after = fmt.Sprintf("%s after the lock on %s went", time.Since(releasedAt).Round(time.Millisecond), a)
		}
		t.Fatalf("tenant %s's event (written without NOTIFY) published %s after it was written (%s), with poll_interval 50ms: "+
			"a lock on tenant %s's outbox_events blocks the one look over all idle sources", b, took.Round(time.Millisecond), after, a)
	}
	<-released
}

// TestAdvConfigSecondDocumentRefused: Parse "refuses unknown keys", so that
// a setting the operator wrote is never silently not applied. A file with a
// second YAML document (a stray "---", or two files concatenated) has its
// second half ignored: here relay.idle_max and a whole source would not be
// served, without a word.
func TestAdvConfigSecondDocumentRefused(t *testing.T) {
	_, err := outboxfleet.Parse([]byte(`
databases: {db: {url: "postgres://relay@db/orders"}}
destinations: {events: {url: "nats://nats:4222"}}
sources: [{database: db, schema: orders, destination: events}]
---
relay: {idle_max: 5s}
sources: [{database: db, schema: billing, destination: events}]
`))
	if err == nil {
		t.Fatal("a configuration with a second YAML document was accepted; its settings and sources are silently ignored")
	}
}

// TestAdvUnreadableSchemaHidesTheOthers: a schema pattern takes "every
// matching schema ... found as it appears". A matching schema the relay's
// role cannot read (another team's, or a tenant whose grants are not given
// yet) makes the discovery fail as a whole when it reads that schema's
// migration version, so the schemas sorted after it are never started:
// tenant c, fully migrated and granted, is not served while tenant b stays
// unreadable.
func TestAdvUnreadableSchemaHidesTheOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "ur")
	a, b, c := prefix+"_a", prefix+"_b", prefix+"_c"
	migrateSchemas(t, admin, a, b, c)
	role := prefix + "_relay"
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	for _, s := range []string{a, c} { // b: no grants
		for _, g := range []string{"GRANT USAGE ON SCHEMA %s TO %s", "GRANT ALL ON ALL TABLES IN SCHEMA %s TO %s",
			"GRANT ALL ON ALL SEQUENCES IN SCHEMA %s TO %s", "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %s TO %s"} {
			if _, err := admin.Exec(ctx, fmt.Sprintf(g, s, role)); err != nil {
				t.Fatal(err)
			}
		}
	}
	u, err := url.Parse(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	st := newStream(t)
	// The tables are the admin's (the migration role), the relay another
	// role: trusted_owners names the admin (pgtrust).
	var owner string
	if err := admin.QueryRow(ctx, "SELECT current_user").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 2s}
databases:
  db: {url: %q, max_conns: 4, trusted_owners: [%s]}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: db, schema_pattern: "%s_*", destination: events}
`, u.String(), owner, prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 30*time.Second, "tenant a running", func() bool { return running(f)[a] })
	var w written
	w.write(t, admin, c, "order", 1, 1)
	deadline := time.Now().Add(10 * time.Second)
	for !running(f)[c] {
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s (migrated, granted) not served after 10s with discover_interval 200ms; sources: %+v; ready: %v",
				c, f.Sources(), f.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, 30*time.Second, "tenant c's event published", func() bool { return st.count(t) == 1 })
	if err := f.Ready(); err == nil || !strings.Contains(err.Error(), b) || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("Ready() = %v; want it to name the unreadable schema %s and why", err, b)
	}
}

// TestAdvSchemaRecreatedUnderARunningRelay: a tenant's schema is dropped
// and created again (a tenant reset) before the next discovery: the running
// relay must serve the new tables, every event published in order.
func TestAdvSchemaRecreatedUnderARunningRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "rc")
	a := prefix + "_a"
	migrateSchemas(t, admin, a)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 1h, idle_max: 2s}
databases:
  db: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: db, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 30*time.Second, "tenant a running", func() bool { return running(f)[a] })
	var w1 written
	w1.write(t, admin, a, "order", 3, 3)
	waitFor(t, 30*time.Second, "first events out", func() bool { return st.count(t) == 9 })
	// Dropped and created again in one transaction: no look or discovery
	// sees the schema missing; the running relay meets the new tables.
	script, err := outboxmigrate.SQL(a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "DROP SCHEMA "+a+" CASCADE; CREATE SCHEMA "+a+";\n"+script); err != nil {
		t.Fatal(err)
	}
	var w2 written
	w2.write(t, admin, a, "order", 3, 3)
	deadline := time.Now().Add(30 * time.Second)
	for st.count(t) < 18 {
		if time.Now().After(deadline) {
			t.Fatalf("events of the re-created schema: %d of 9 published after 30s, %d unpublished; sources %+v; ready %v",
				st.count(t)-9, unpublishedIn(t, admin, a), f.Sources(), f.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	msgs := st.messages(t)
	w2.checkDelivered(t, msgs[9:], nil)
}

// TestAdvTwoConnectionsManySources: max_conns 2 (the least the file
// accepts) for eight sources with backlogs: no relay waits for a second
// connection while holding the first for ever; everything goes out, in
// order.
func TestAdvTwoConnectionsManySources(t *testing.T) {
	t.Parallel()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "tc")
	var schemas []string
	for i := 0; i < 8; i++ {
		schemas = append(schemas, fmt.Sprintf("%s_%d", prefix, i))
	}
	migrateSchemas(t, admin, schemas...)
	var w written
	for _, s := range schemas {
		w.write(t, admin, s, "order", 40, 5)
	}
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 2s, batch_size: 50, rescan_interval: 100ms, heartbeat_interval: 50ms, lane_sweep_interval: 50ms, vacuum_interval: 100ms}
databases:
  db: {url: %q, max_conns: 2}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: db, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	// Writers keep adding while the fleet drains.
	for _, s := range schemas {
		w.write(t, admin, s, "order", 40, 2)
	}
	waitFor(t, 90*time.Second, "every event published", func() bool { return unpublishedIn(t, admin, schemas...) == 0 })
	w.checkDelivered(t, st.messages(t), nil)
}

// TestAdvOneBlockedLaneSlowsTheWholeSource: "writers that do not notify
// ... within poll_interval". One lane whose head backs off (a failing
// event, up to RetryBackoffMax, 5 min by default; here its available_at set
// an hour ahead) leaves its successor due but not claimable; the look then
// backs off for the whole source, so events of every other aggregate of
// that source, written without NOTIFY, wait up to idle_max instead of
// poll_interval. The docs' caveat names the blocked lane's own events
// ("looked at less often"), not the rest of the source.
func TestAdvOneBlockedLaneSlowsTheWholeSource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "bl")
	a := prefix + "_a"
	migrateSchemas(t, admin, a)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 10s}
databases:
  db: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: db, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 30*time.Second, "tenant a running", func() bool { return running(f)[a] })
	wr, err := outbox.NewWriter(outbox.WriterConfig{Schema: a})
	if err != nil {
		t.Fatal(err)
	}
	// The blocked lane: head backing off, successor due.
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := wr.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "stuck", Type: "A", Payload: []byte(`{}`)},
		outbox.Event{AggregateType: "order", AggregateID: "stuck", Type: "B", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE "+a+".outbox_events SET available_at = now() + interval '1 hour', attempt_count = 12, last_error = 'failing' WHERE event_id = $1", recs[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The source idles with its blocked lane for a while (scenario time,
	// not synchronisation).
	time.Sleep(15 * time.Second)
	var worst time.Duration
	for i := 0; i < 3; i++ {
		if err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
			_, err := wr.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("fresh-%d", i), Type: "A", Payload: []byte(`{}`)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitFor(t, 60*time.Second, "fresh event published", func() bool { return st.count(t) == uint64(i+1) })
		worst = max(worst, time.Since(start))
	}
	if worst > 2*time.Second {
		t.Fatalf("an event of an unblocked aggregate, written without NOTIFY, took up to %s to go out (poll_interval 50ms, idle_max 10s): "+
			"one blocked lane slows the look for the whole source", worst.Round(time.Millisecond))
	}
}

// TestAdvListenerKilledEventStillOut: the shared LISTEN connection is
// terminated (pg_terminate_backend) and a writer notifies while it is
// gone: the event still goes out within a few poll_intervals (the look),
// not idle_max.
func TestAdvListenerKilledEventStillOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "lr")
	a := prefix + "_a"
	migrateSchemas(t, admin, a)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 60s}
databases:
  db: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: db, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 30*time.Second, "tenant a running", func() bool { return running(f)[a] })
	channel := outbox.NotifyChannel(a)
	listener := func() int {
		var pid int
		// The listener's last statement LISTENs on the source's channel.
		if err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE query LIKE '%LISTEN%' AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid() LIMIT 1`, channel).Scan(&pid); err != nil {
			return 0
		}
		return pid
	}
	var pid int
	waitFor(t, 30*time.Second, "listener connected", func() bool { pid = listener(); return pid != 0 })
	wr, err := outbox.NewWriter(outbox.WriterConfig{Schema: a})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		if _, err := wr.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "x", Type: "A", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		return wr.Notify(ctx, tx)
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "event published", func() bool { return st.count(t) == 1 })
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("event notified while the listener was down took %s (poll_interval 50ms, idle_max 60s)", took.Round(time.Millisecond))
	}
}
