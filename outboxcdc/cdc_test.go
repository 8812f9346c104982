package outboxcdc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxnats"
)

// TestCDCPublishesCommittedInsertsInOrder: with no polling relay at all,
// events written by concurrent writers reach the broker through the WAL,
// each once, in order per aggregate, and the slot is confirmed past the
// last of them.
func TestCDCPublishesCommittedInsertsInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c, _ := e.startCDC(t, "main", e.relay(t, "cdc", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)

	var wg sync.WaitGroup
	lsns := make([]uint64, 3)
	for wr := 0; wr < 3; wr++ {
		wg.Add(1)
		go func(wr int) {
			defer wg.Done()
			lsns[wr] = uint64(e.write(t, "w", 4, 30))
		}(wr)
	}
	wg.Wait()
	total := 3 * 4 * 30
	outboxtest.Eventually(t, 60*time.Second, "all published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	seen := checkInvariants(t, e.brokerMessages(t), total)
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("event %s delivered %d times without any fault", id, n)
		}
	}
	if got := c.Stats().Published(); got != int64(total) {
		t.Fatalf("CDC published %d events, want all %d (no polling relay ran)", got, total)
	}
	// Writers of the same aggregates commit k+1 right after k: the stream
	// still leaves nothing to the safety net.
	if st := c.Stats(); st.Left() != 0 || st.AlreadyPublished() != 0 || st.Waiting() != 0 {
		t.Fatalf("left %d, found published %d, waiting %d in a clean run; want 0", st.Left(), st.AlreadyPublished(), st.Waiting())
	}
	slot := outboxcdc.SlotName(e.schema, "main")
	for _, l := range lsns {
		outboxtest.Eventually(t, 30*time.Second, "slot confirmed past the last commit", func() bool { return uint64(e.confirmed(t, slot)) > l })
	}
}

// TestSetupNeedsLogicalWAL: the shared server runs with wal_level=replica;
// Setup says what to change.
func TestSetupNeedsLogicalWAL(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	err := outboxcdc.Setup(context.Background(), outboxcdc.Config{Pool: pool, Schema: schema})
	if !errors.Is(err, outboxcdc.ErrWALLevel) || !strings.Contains(err.Error(), "wal_level = logical") {
		t.Fatalf("Setup on a wal_level=replica server: %v; want ErrWALLevel saying what to set", err)
	}
}

// TestSetupIsIdempotent: a second Setup finds the publication and the slot.
func TestSetupIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	cfg := outboxcdc.Config{Pool: e.pool, Schema: e.schema, Group: "g"}
	for i := 0; i < 2; i++ {
		if err := outboxcdc.Setup(context.Background(), cfg); err != nil {
			t.Fatalf("Setup #%d: %v", i+1, err)
		}
	}
	if e.confirmed(t, outboxcdc.SlotName(e.schema, "g")) == 0 {
		t.Fatal("no slot after Setup")
	}
}

// TestStandbyTakesOver: two CDC relays of one group; one streams, the other
// stands by. When the streaming one stops, the standby takes the slot over
// from the confirmed position, and nothing is lost or reordered.
func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	a, stopA := e.startCDC(t, "g", e.relay(t, "cdc-a", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "a streams", a.Stats().Streaming)
	b, _ := e.startCDC(t, "g", e.relay(t, "cdc-b", 0, nil), nil)
	e.write(t, "before", 3, 10)
	outboxtest.Eventually(t, 30*time.Second, "published by a", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	if b.Stats().Streaming() || b.Stats().Published() != 0 {
		t.Fatal("the standby streamed while the first relay held the slot")
	}
	outboxtest.Eventually(t, 30*time.Second, "b stands by", func() bool { return b.Ready() == nil })
	// A quiet standby (issue 27): it looks at pg_replication_slots every
	// StandbyInterval (100 ms here) instead of trying START_REPLICATION,
	// whose refusal ("replication slot ... is active for PID ...") writes an
	// ERROR and its statement into the server's log at every try.
	checks := b.Stats().StandbyChecks()
	outboxtest.Eventually(t, 30*time.Second, "b looked 20 more times", func() bool { return b.Stats().StandbyChecks() >= checks+20 })
	if log := e.cluster.Log(); strings.Contains(log, "is active for PID") {
		t.Fatalf("the standby left lines in the server's log while it waited:\n%s", log)
	}
	if err := a.Ready(); err != nil {
		t.Fatalf("the streaming relay is not ready: %v", err)
	}
	stopA()
	outboxtest.Eventually(t, 30*time.Second, "b took over", b.Stats().Streaming)
	e.write(t, "after", 3, 10)
	outboxtest.Eventually(t, 30*time.Second, "published by b", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	checkInvariants(t, e.brokerMessages(t), 60)
	if a.Stats().Published() != 30 || b.Stats().Published() != 30 {
		t.Fatalf("a published %d, b %d; want 30 each", a.Stats().Published(), b.Stats().Published())
	}
}

// TestInvalidatedSlotIsRecreatedAndTheGapPublished: with a tiny
// max_slot_wal_keep_size, a stopped CDC relay's slot is invalidated while
// events are written. The relay, started again, recreates the slot; the
// safety net publishes the gap from the table; events written afterwards
// come through the new slot.
func TestInvalidatedSlotIsRecreatedAndTheGapPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, map[string]string{"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB", "min_wal_size": "32MB"})
	ctx := context.Background()
	slot := outboxcdc.SlotName(e.schema, "g")
	c, stop := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	e.write(t, "first", 2, 5)
	outboxtest.Eventually(t, 30*time.Second, "first published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	stop()

	e.write(t, "gap", 2, 5)
	for i := 0; i < 4; i++ {
		if _, err := e.pool.Exec(ctx, "CREATE TEMP TABLE filler AS SELECT g, repeat('x', 500) AS pad FROM generate_series(1, 5000) g; DROP TABLE filler; SELECT pg_switch_wal()"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	var status string
	if err := e.pool.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "lost" {
		t.Fatalf("slot wal_status %q after the WAL moved on; the test needs it lost", status)
	}
	if slots, err := outboxcdc.Slots(ctx, e.pool, e.schema); err != nil || len(slots) != 1 || slots[0].WALStatus != "lost" || slots[0].Active {
		t.Fatalf("Slots: %+v, %v; want the one slot, lost and not streamed", slots, err)
	}

	c2, _ := e.startCDC(t, "g", e.relay(t, "cdc2", 0, nil), e.relay(t, "net", 100*time.Millisecond, nil))
	outboxtest.Eventually(t, 30*time.Second, "streaming again", c2.Stats().Streaming)
	if c2.Stats().Invalidations() != 1 {
		t.Fatalf("%d invalidations seen, want 1", c2.Stats().Invalidations())
	}
	outboxtest.Eventually(t, 30*time.Second, "the gap published by the safety net", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	e.write(t, "after", 2, 5)
	outboxtest.Eventually(t, 30*time.Second, "later events published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	checkInvariants(t, e.brokerMessages(t), 30)
	if c2.Stats().Published() == 0 {
		t.Fatal("nothing came through the recreated slot")
	}
	if err := e.pool.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&status); err != nil || status == "lost" {
		t.Fatalf("recreated slot: status %q, %v", status, err)
	}
}

// TestBrokerOutageHoldsTheSlot: while the destination is down, the stream
// keeps its position (the slot holds the WAL) and retries the same events;
// when the broker returns, the CDC path itself publishes them, in order.
func TestBrokerOutageHoldsTheSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	srv := natstest.Embedded(t)
	port := srv.Port()
	js := natstest.JetStream(t, natstest.Connect(t, srv.ClientURL()))
	cfg := natstest.Config(t)
	cfg.DuplicateWindow = 100 * time.Millisecond
	pub := natstest.Publisher(t, js, cfg)
	e.js, e.stream = js, cfg.Stream
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, pub), nil)
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	e.write(t, "before", 3, 3)
	outboxtest.Eventually(t, 30*time.Second, "published before the outage", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	slot := outboxcdc.SlotName(e.schema, "g")
	before := e.confirmed(t, slot)

	srv.Shutdown()
	last := e.write(t, "during", 3, 3)
	outboxtest.Eventually(t, 30*time.Second, "the stream met the outage", func() bool { return c.Stats().Outages() >= 2 })
	if got := e.confirmed(t, slot); got > last {
		t.Fatalf("slot confirmed at %s past events not yet published (last commit before %s; %s before the outage)", got, last, before)
	}
	if slots, err := outboxcdc.Slots(context.Background(), e.pool, e.schema); err != nil || len(slots) != 1 || !slots[0].Active || slots[0].LagBytes <= 0 {
		t.Fatalf("Slots during the outage: %+v, %v; want the slot streamed and lagging", slots, err)
	}
	srv2, err := outboxnats.StartEmbedded(srv.StoreDir(), port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv2.Shutdown)
	outboxtest.Eventually(t, 60*time.Second, "published after the outage", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	outboxtest.Eventually(t, 30*time.Second, "slot confirmed past them", func() bool { return e.confirmed(t, slot) > last })
	checkInvariants(t, e.brokerMessages(t), 18)
	if c.Stats().Published() != 18 || c.Stats().Left() != 0 {
		t.Fatalf("CDC published %d, left %d; want all 18 published by the stream (no safety net ran)", c.Stats().Published(), c.Stats().Left())
	}
}

// TestPostgresRestartUnderTheStream: PostgreSQL crashes (immediate stop)
// and comes back under a streaming relay; it reconnects and resumes from the
// slot, and every event, written before and after, is published in order.
func TestPostgresRestartUnderTheStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c, _ := e.startCDC(t, "g", e.relay(t, "cdc", 0, nil), e.relay(t, "net", time.Second, nil))
	outboxtest.Eventually(t, 30*time.Second, "streaming", c.Stats().Streaming)
	e.write(t, "before", 3, 5)
	if err := e.cluster.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := e.cluster.Start(); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 60*time.Second, "streaming again", c.Stats().Streaming)
	e.write(t, "after", 3, 5)
	outboxtest.Eventually(t, 60*time.Second, "all published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	checkInvariants(t, e.brokerMessages(t), 30)
}
