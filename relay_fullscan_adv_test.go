package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestFullScanBatchTakenDuringBacklog: while a relay drains a backlog over
// many lanes it claims each batch ahead of the one it publishes, and the
// batch of a background full scan is taken only when no batch was claimed
// ahead. Its events stay leased by the running relay, unpublished, past
// their lease, and no other full scan starts while that batch waits: their
// lanes wait for the backlog to end instead of a RescanInterval.
func TestFullScanBatchTakenDuringBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	writeEvents(t, pool, w, 100, 40)
	// 1,000 batches of 8 ms at least: the backlog lasts 8 s or more, so
	// that a batch left to its end stays leased past its lease by far more
	// than stale (5 s), which is room for a loaded machine's slow round.
	cfg := quietConfig(schema, slowPublisher{next: b.pub, delay: 8 * time.Millisecond})
	cfg.BatchSize = 4
	cfg.LeaseDuration = 300 * time.Millisecond
	cfg.RescanInterval = 50 * time.Millisecond
	r, _ := startRelay(t, pool, cfg)
	const stale = 5 * time.Second
	start := time.Now()
	for time.Since(start) < 60*time.Second {
		var left, expired int
		var oldest *string
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL),
			count(*) FILTER (WHERE published_at IS NULL AND claimed_by = $1 AND claim_until < now() - $2 * interval '1 millisecond'),
			min(aggregate_id || '#' || aggregate_sequence) FILTER (WHERE published_at IS NULL AND claimed_by = $1 AND claim_until < now() - $2 * interval '1 millisecond')
			FROM `+schema+`.outbox_events`, r.ID(), stale.Milliseconds()).Scan(&left, &expired, &oldest); err != nil {
			t.Fatal(err)
		}
		if expired > 0 {
			t.Fatalf("after %s, %d events (%s first) are leased by the running relay %s, their lease ended more than %s ago, unpublished, while it drains the rest (%d left, %d published): their lanes wait for the backlog's end, not a RescanInterval (%s)",
				time.Since(start).Round(time.Millisecond), expired, *oldest, r.ID(), stale, left, r.Stats().Published, cfg.RescanInterval)
		}
		if left == 0 {
			t.Logf("drained in %s", time.Since(start))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("backlog not drained in 60 s")
}

// TestStopDoesNotWaitForABackgroundFullScan: a relay asked to stop while a
// background full scan runs (one that walks seconds of entries vacuum
// cannot remove: held here) returns within its ShutdownTimeout. Run's
// deferred dropFullScan waits for the scan, which is not cancelled, however
// long it takes: the relay's stop is bounded by the slowest full scan, not
// by ShutdownTimeout, and a supervisor's grace period runs out first.
func TestStopDoesNotWaitForABackgroundFullScan(t *testing.T) {
	t.Parallel()
	setup, schema := outboxtest.Schema(t)
	pool, holder := heldScanPool(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := quietConfig(schema, b.pub)
	cfg.RescanInterval = 20 * time.Millisecond
	cfg.ShutdownTimeout = 200 * time.Millisecond
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(holder.release) }) }
	defer release()
	_, stop := startRelay(t, pool, cfg)
	writeEventsFor(t, setup, w, "first")
	publishedSoon(t, setup, schema, "an event written before any full scan is held", "first")
	select {
	case <-holder.held:
	case <-time.After(30 * time.Second):
		t.Fatal("no second full scan within 30 s (RescanInterval 20 ms)")
	}
	stopped := make(chan struct{})
	start := time.Now()
	go func() { defer close(stopped); stop() }()
	// The held scan is let go only below: a stop that waits for it never
	// returns, so a bound far beyond ShutdownTimeout (a minute) tells it
	// from a loaded machine's slow stop.
	const bound = time.Minute
	select {
	case <-stopped:
	case <-time.After(bound):
		release()
		<-stopped
		t.Fatalf("the relay's Run returned %s after its context ended (ShutdownTimeout %s), only once the held background full scan was let go: its stop waits for the slowest full scan",
			time.Since(start).Round(time.Millisecond), cfg.ShutdownTimeout)
	}
}
