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
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// TestFleetDatabaseDownIsolated: one fleet over the shared server and a
// private cluster. While the private cluster is stopped, the shared
// server's sources keep publishing, and Ready names the private database
// and its sources (not the others); once it is back, its events go out and
// the fleet is ready again. Every event reaches the stream in
// per-aggregate order.
func TestFleetDatabaseDownIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	cluster := outboxtest.PrivateCluster(t, pgcluster.Config{})
	priv, err := pgxpool.New(ctx, cluster.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(priv.Close)
	prefix := outboxtest.UniqueName(t, "i")
	shared := []string{prefix + "_a", prefix + "_b"}
	private := []string{"priv_a", "priv_b"}
	migrateSchemas(t, admin, shared...)
	migrateSchemas(t, priv, private...)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 1s}
databases:
  shared: {url: %q, max_conns: 4}
  private: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: shared, schema_pattern: "%s_*", destination: events}
  - {database: private, schema_pattern: "priv_*", destination: events}
`, outboxtest.DatabaseURL(), cluster.URL(""), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 60*time.Second, "4 sources running", func() bool { return len(running(f)) == 4 })
	var w written
	for _, s := range shared {
		w.write(t, admin, s, "order", 3, 3)
	}
	for _, s := range private {
		w.write(t, priv, s, "order", 3, 3)
	}
	waitFor(t, 60*time.Second, "first events published", func() bool {
		return unpublishedIn(t, admin, shared...) == 0 && unpublishedIn(t, priv, private...) == 0
	})

	if err := cluster.Stop(); err != nil {
		t.Fatal(err)
	}
	priv.Reset()
	for round := 0; round < 3; round++ {
		for _, s := range shared {
			w.write(t, admin, s, "order", 3, 2)
		}
		waitFor(t, 60*time.Second, "the shared server's events published while the private cluster is down", func() bool {
			return unpublishedIn(t, admin, shared...) == 0
		})
	}
	var why string
	waitFor(t, 60*time.Second, "Ready names the private database and its sources", func() bool {
		err := f.Ready()
		if err == nil {
			return false
		}
		why = err.Error()
		return strings.Contains(why, "database private:") && strings.Contains(why, "source private/priv_a:") &&
			strings.Contains(why, "source private/priv_b:")
	})
	if strings.Contains(why, "shared") {
		t.Fatalf("Ready %q names the shared server, which is up", why)
	}

	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	for _, s := range private {
		w.write(t, priv, s, "order", 3, 2)
	}
	waitFor(t, 60*time.Second, "the private cluster's events published once it is back", func() bool {
		return unpublishedIn(t, priv, private...) == 0
	})
	waitFor(t, 60*time.Second, "the fleet ready again", func() bool { return f.Ready() == nil })
	w.checkDelivered(t, st.messages(t), nil)
}
