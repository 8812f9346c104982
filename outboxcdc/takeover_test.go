package outboxcdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// TestTakeoverDecodesAgainFromAPinnedRestartLSN: a transaction that wrote
// something and stays open holds the slot's restart_lsn back while the
// stream publishes and confirms past it; Slots shows the WAL a takeover
// must decode again. A standby then takes over: PostgreSQL decodes that WAL
// again before it sends the event committed after the takeover began. The
// test logs what the takeover cost (WAL decoded again, time to stream,
// time to the first new event published): BENCHMARKS.md has the figures.
//
// A transaction that only took an xid (BEGIN; SELECT txid_current();) and
// wrote nothing holds the slot's catalog_xmin, not its restart_lsn: the
// first part checks that too.
func TestTakeoverDecodesAgainFromAPinnedRestartLSN(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	slot := outboxcdc.SlotName(e.schema, "g")
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+e.schema+`.filler (id int, pad text)`); err != nil {
		t.Fatal(err)
	}
	a, stopA := e.startCDC(t, "g", e.relay(t, "cdc-a", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "a streams", a.Stats().Streaming)
	b, _ := e.startCDC(t, "g", e.relay(t, "cdc-b", 0, nil), nil)
	outboxtest.Eventually(t, 30*time.Second, "b stands by", b.Stats().StandingBy)

	redecode := func() int64 {
		slots, err := outboxcdc.Slots(ctx, e.pool, e.schema)
		if err != nil || len(slots) != 1 {
			t.Fatalf("Slots: %+v, %v", slots, err)
		}
		return slots[0].RedecodeBytes
	}
	fill := func(txs int) {
		for i := 0; i < txs; i++ {
			if _, err := e.pool.Exec(ctx, `INSERT INTO `+e.schema+`.filler SELECT g, repeat('x', 100) FROM generate_series(1, 10000) g`); err != nil {
				t.Fatal(err)
			}
		}
	}
	// settle writes WAL and events, then waits until the stream confirmed
	// past them and restart_lsn moved as far as it can: CHECKPOINT logs
	// the running transactions, where restart_lsn may move to.
	settle := func(tag string) {
		fill(10)
		last := e.write(t, tag, 4, 50)
		if _, err := e.pool.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		e.write(t, tag+"-after", 1, 1)
		outboxtest.Eventually(t, 60*time.Second, "confirmed past "+tag, func() bool { return e.confirmed(t, slot) > last })
		outboxtest.Eventually(t, 60*time.Second, "all published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	}

	// A transaction that holds an xid and wrote nothing.
	idle, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idle.Exec(ctx, "SELECT txid_current()"); err != nil {
		t.Fatal(err)
	}
	settle("xid-only")
	outboxtest.Eventually(t, 60*time.Second, "restart_lsn not held back by a transaction that wrote nothing", func() bool {
		settle("xid-only-again")
		return redecode() < 4<<20
	})
	_ = idle.Rollback(ctx)

	// A transaction that wrote, left open: restart_lsn stays where it began.
	pin, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pin.Rollback(ctx) }()
	if _, err := pin.Exec(ctx, `INSERT INTO `+e.schema+`.filler VALUES (0, 'pin')`); err != nil {
		t.Fatal(err)
	}
	fill(60) // about 100 MB of small-row WAL
	settle("pinned")
	held := redecode()
	if held < 60<<20 {
		t.Fatalf("redecode %d bytes with an open transaction that wrote before 60 MB of WAL; want at least that", held)
	}
	if status := a.Stats(); status.Left() != 0 {
		t.Fatalf("the stream left %d events", status.Left())
	}

	// The takeover: a stops; b finds the slot free, starts streaming it,
	// and PostgreSQL decodes the held WAL again before the new event.
	stopA()
	start := time.Now()
	e.write(t, "new", 1, 1)
	outboxtest.Eventually(t, 120*time.Second, "b took over", b.Stats().Streaming)
	streaming := time.Since(start)
	outboxtest.Eventually(t, 120*time.Second, "the new event published by b", func() bool { return b.Stats().Published() == 1 })
	first := time.Since(start)
	t.Logf("takeover with restart_lsn held back: %.1f MB to decode again; b streaming after %s, first new event published after %s (loaded 2-core machine)",
		float64(held)/(1<<20), streaming.Round(time.Millisecond), first.Round(time.Millisecond))
	if err := pin.Rollback(ctx); err != nil && err != pgx.ErrTxClosed {
		t.Fatal(err)
	}
	// Every event written: the settle of "xid-only-again" runs as many
	// times as its Eventually needs (once on a quiet machine).
	outboxtest.Eventually(t, 60*time.Second, "all published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	checkInvariants(t, e.brokerMessages(t), e.count(t, "true"))
}
