package outboxfleet_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
)

// TestFleetBacklogDoesNotStarveOthers: while one source drains a backlog of
// 8,000 events through a pool of 3 connections, events written afterwards to
// two other sources of the same database are all published before the
// backlog is done: the backlog takes turns with them.
func TestFleetBacklogDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "b")
	busy, others := prefix+"_busy", []string{prefix + "_x", prefix + "_y"}
	migrateSchemas(t, admin, append([]string{busy}, others...)...)
	st := newStream(t)
	var w written
	// The backlog is written before the fleet starts.
	w.write(t, admin, busy, "order", 1000, 8)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 2s, batch_size: 200}
databases:
  main: {url: %q, max_conns: 3}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: main, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 60*time.Second, "3 sources running", func() bool { return len(running(f)) == 3 })
	waitFor(t, 60*time.Second, "the backlog being drained", func() bool { return unpublishedIn(t, admin, busy) < 7800 })
	for _, s := range others {
		w.write(t, admin, s, "order", 5, 2)
	}
	waitFor(t, 120*time.Second, "the other sources' events published", func() bool { return unpublishedIn(t, admin, others...) == 0 })
	if left := unpublishedIn(t, admin, busy); left == 0 {
		t.Fatal("the backlog drained before the other sources' events went out: the test proves nothing (make it larger)")
	} else {
		t.Logf("the other sources' events went out with %d events of the backlog still pending", left)
	}
	waitFor(t, 300*time.Second, "the backlog drained", func() bool { return unpublishedIn(t, admin, busy) == 0 })
	w.checkDelivered(t, st.messages(t), nil)
}
