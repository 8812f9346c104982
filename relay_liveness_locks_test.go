package outbox_test

// Adversarial review (stop 33) of the locked-lane hand-over (bd4de1d,
// 6608ab1): tests failing on the code reviewed; see each comment.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestLivenessStopWithALockedLaneInOver: shape of
// TestLivenessContLockedByALongClaim (k in flight at relay A, k+1 passed by
// relay B's cursor as not a head, then k+1 held locked by another
// transaction while A publishes k), but relay A is STOPPED while the lane
// is still in its claimCursor.over (locked for more than contRetries
// claims, handOffSkipSQL returning it as locked at every claim).
//
// handOffLanes, the stopping relay's last write, handed over cont AND over
// with a plain UPDATE: it waited on the row lock that handOffSkipSQL was
// written to skip (a relay statement waiting on an application's lock; the
// over list holds precisely the lanes known to be locked) for
// ShutdownTimeout, and then its whole statement was cancelled: no lane of
// cont or over was handed over (found by the stop-33 review). It now skips
// the locked rows too: the stop is prompt, the other lanes are handed over,
// and a lane still locked is left, as a relay that dies leaves its lanes,
// to the other relays' full scans (here relay B's, every second).
//
// A's ShutdownTimeout is two minutes, so that a hand-off waiting on the
// lock would hold the stop that long: the bound on the stop (20 s) then
// tells that wait from a loaded machine's slow stop.
func TestLivenessStopWithALockedLaneInOver(t *testing.T) {
	t.Parallel()
	const shutdown, bound = 2 * time.Minute, 20 * time.Second
	l := startLockedLane(t, 8,
		func(c *outbox.RelayConfig) { c.ShutdownTimeout = shutdown },
		func(c *outbox.RelayConfig) { c.RescanInterval = time.Second }) // the net for a lane left locked at A's stop
	// The lane is in A's over now. A stops while the lock is held.
	start := time.Now()
	l.stopA()
	if d := time.Since(start); d > bound {
		t.Errorf("relay A took %s to stop (ShutdownTimeout %s), want well under it (%s): its hand-off (handOffLanes) waited on the application's row lock",
			d.Round(time.Millisecond), shutdown, bound)
	}
	if err := l.lock.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.b.Wake()
	publishedSoon(t, l.pool, l.schema, "k+1, once its lock is gone (relay A stopped, relay B alive)", "lane")
}

// TestSweepHandLiftWaitsOnTheHeadsLockHoldingTheLane: item 2 of 6608ab1
// (parked.go sweepLane) makes the head of an unparked lane due when it is
// as written (a quarantine set and lifted by hand) with a plain UPDATE of
// the head's row, run while the sweep holds the lane's counter row
// (outbox_aggregates, FOR UPDATE). The unpark before it only touches the
// parked events (available_at = 'infinity'), which nothing else locks; the
// head is the row an operator repairing the event by hand (the very shape
// this serves: a quarantine set and lifted by hand, e.g. a payload fixed in
// a transaction still open) or an application holds. The sweep then waits
// on that application's lock, and while it waits it holds the counter row:
// every writer of the aggregate (Writer.InsertTx locks the counter row)
// waits behind the relay's sweep. parked.go promises the sweep "never
// waits for a writer's transaction" and takes the counter row with SKIP
// LOCKED for that reason; violated: a relay statement waits on an
// application's lock, and blocks the application's writes.
func TestSweepHandLiftWaitsOnTheHeadsLockHoldingTheLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	head := writeQuarantinedByHand(t, pool, w, schema, "lane", 2)
	if _, err := outbox.SweepLanes(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	var parked bool
	if err := pool.QueryRow(ctx, `SELECT parked_at IS NOT NULL FROM `+schema+`.outbox_aggregates WHERE aggregate_id = 'lane'`).Scan(&parked); err != nil || !parked {
		t.Fatalf("lane not parked by the sweep: %v %v", parked, err)
	}
	// The quarantine is lifted by hand; the operator (or the application)
	// then holds the head's row in a transaction of its own.
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = NULL WHERE event_id = $1`, head); err != nil {
		t.Fatal(err)
	}
	op, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = op.Rollback(ctx) }()
	if _, err := op.Exec(ctx, `SELECT 1 FROM `+schema+`.outbox_events WHERE event_id = $1 FOR UPDATE`, head); err != nil {
		t.Fatal(err)
	}
	// The head's lock is held until the test ends: a sweep (and a writer
	// behind it) that waits on it waits that long, so the bounds below
	// (30 s each) tell that wait from a loaded machine's slow statement.
	const bound = 30 * time.Second
	sweepCtx, cancelSweep := context.WithCancel(ctx)
	defer cancelSweep()
	sweepDone := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		_, _ = outbox.SweepLanes(sweepCtx, pool, schema)
		sweepDone <- time.Since(start)
	}()
	// The sweep must end without the head's lock (it leaves the lane
	// busy); before, it waited on it, holding the counter row.
	select {
	case d := <-sweepDone:
		t.Logf("sweep took %s", d)
	case <-time.After(bound):
		t.Errorf("the lane sweep is still waiting on the head's row lock held by another transaction, after %s", bound)
	}
	// A writer appends to the lane, as the application does all day.
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := time.Now()
	werr := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(wctx, tx, orderEvent("lane", "Tick"))
		return err
	})
	if werr != nil {
		t.Errorf("the application's writer of the lane waited %s behind the lane sweep (which waits on the head's row lock): %v",
			time.Since(start).Round(time.Millisecond), werr)
	}
}
