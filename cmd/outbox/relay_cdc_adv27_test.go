package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// TestAdv27RelayCDCAsTheLeastPrivilegedRole: docs/operations.md says the
// CDC relay's role needs REPLICATION and what `outbox migrate
// --print-grants` gives the relay role; only creating the publication needs
// the table's owner. `outbox relay --mode cdc --metrics-addr` runs here as
// such a role (the owner ran the grants and created the publication; the
// relay creates its slot): it must stream, publish, report itself ready,
// export the slot's metrics, and log nothing about a missing right (a query
// failing and falling back quietly).
func TestAdv27RelayCDCAsTheLeastPrivilegedRole(t *testing.T) {
	t.Parallel()
	c := outboxtest.PrivateCluster(t, pgcluster.Config{Settings: map[string]string{"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}})
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const schema = "cdc_least"
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"outbox_writer", "outbox_relay", "outbox_operator", "outbox_consumer"} {
		if _, err := pool.Exec(ctx, "CREATE ROLE "+r+" NOLOGIN"); err != nil {
			t.Fatal(err)
		}
	}
	script, err := outboxmigrate.Grants(schema, outboxmigrate.Roles{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE ROLE cdc_login LOGIN REPLICATION IN ROLE outbox_relay"); err != nil {
		t.Fatal(err)
	}
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: pool, Schema: schema}); err != nil {
		t.Fatal(err)
	}
	slot := outboxcdc.SlotName(schema, outboxcdc.GroupDefault)
	if _, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(c.URL(""), "postgres://postgres@", "postgres://cdc_login@", 1)
	js := natstest.JetStream(t, natstest.Conn(t))
	ncfg := natstest.Config(t)
	natstest.DeleteStreamAtCleanup(t, js, ncfg.Stream)
	relay := startRelayProcess(t, "--database-url", url, "--mode", "cdc", "--schema", schema,
		"--destination", outboxtest.NATSURL(), "--nats-stream", ncfg.Stream, "--nats-subject-prefix", ncfg.SubjectPrefix,
		"--metrics-addr", "127.0.0.1:0", "--poll-interval", "50ms", "--reconcile-after", "2s")
	var addr string
	select {
	case addr = <-relay.addr:
	case err := <-relay.waitErr:
		t.Fatalf("relay exited: %v\n%s", err, relay.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not report its metrics address:\n%s", relay.log())
	}
	labels := map[string]string{"schema": schema, "slot": slot}
	outboxtest.Eventually(t, 60*time.Second, "the relay streams its slot", func() bool {
		fams, err := promrules.Scrape("http://" + addr + "/metrics")
		v, ok := promrules.Value(fams, "outbox_cdc_slot_active", labels)
		return err == nil && ok && v == 1
	})
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o1", Type: "Step", Payload: []byte(`{}`)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.Eventually(t, 60*time.Second, "the CDC path published the 5 events", func() bool {
		fams, err := promrules.Scrape("http://" + addr + "/metrics")
		v, _ := promrules.Value(fams, "outbox_cdc_events_published_total", map[string]string{"schema": schema})
		return err == nil && v == 5
	})
	outboxtest.Eventually(t, 30*time.Second, "/readyz 200", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// A few looks of the safety net and scrapes later, the log must not
	// show a right missing.
	fams, err := promrules.Scrape("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := promrules.Value(fams, "outbox_cdc_slot_lag_bytes", labels); !ok {
		t.Errorf("outbox_cdc_slot_lag_bytes missing for the relay's own slot")
	}
	time.Sleep(3 * time.Second) // the safety net looks every 500 ms: let it look a few times (not an assertion on time)
	for _, bad := range []string{"permission denied", "42501", "must be superuser", "must be owner"} {
		if strings.Contains(relay.log(), bad) {
			t.Fatalf("the least-privileged relay logged %q:\n%s", bad, relay.log())
		}
	}
}
