package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// claimSizes counts the incremental claims that found events, and those
// events.
type claimSizes struct{ claims, events atomic.Int64 }

func (c *claimSizes) ObserveClaim(o outbox.ClaimObservation) {
	if o.Err == nil && !o.FullScan && o.Events > 0 {
		c.claims.Add(1)
		c.events.Add(int64(o.Events))
	}
}

// TestWideBacklogDrainHandsNoLaneOver: a backlog over many more lanes than
// a claim takes. After each batch the relay remembers every lane it
// published up to, to look for its next event (claimCursor.cont); those
// next events lie ahead of its cursor, where the range scan reads them
// anyway. Looked for by key at every claim, they piled up past the bound
// of four windows, and the rest were handed over: one row update each,
// made due, then sorted by every claim's due scan, which grew with the
// backlog's width (the drain fell to 0.36-0.44x the naive relay, BENCHMARKS.md).
// Now a lane whose next event lies at or past the cursor is set aside until
// the cursor reaches it: the drain hands nothing over, and order holds. And
// the range scan itself must then fill the batches: heads of equal
// available_at and occurred_at (one transaction's) are taken lowest
// position first, so that what a claim leaves for lack of room lies past
// what it took; taken in any order, the cursor stayed at the lowest left
// head, near the window's start, and the next claim read mostly the same
// rows again (about 25 events a claim of 100 here).
func TestWideBacklogDrainHandsNoLaneOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	// Three events a lane (six until 7 December 2026): every lane still
	// has successors to look for after the first pass, in half the claims.
	const lanes, perLane = 1500, 3
	writeEvents(t, pool, w, lanes, perLane)
	cfg := quietConfig(schema, b.pub)
	cfg.BatchSize = 100 // window 125: the lanes are twelve windows wide
	var sizes claimSizes
	cfg.Observer = &sizes
	startRelay(t, pool, cfg)
	outboxtest.Eventually(t, 3*time.Minute, "the backlog drained", func() bool { return countUnpublished(t, pool, schema) == 0 })
	var moved int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE available_at <> occurred_at`).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	if moved > 0 {
		t.Fatalf("%d of %d events were handed over (made due) while one relay drained a backlog of %d lanes", moved, lanes*perLane, lanes)
	}
	claims, events := sizes.claims.Load(), sizes.events.Load()
	t.Logf("%d incremental claims took %d events, %.1f a claim", claims, events, float64(events)/float64(max(claims, 1)))
	if claims > 0 && events < claims*int64(cfg.BatchSize)*6/10 {
		t.Fatalf("%d incremental claims took %d events, %.1f a claim of at most %d: the range scan re-reads what it left",
			claims, events, float64(events)/float64(claims), cfg.BatchSize)
	}
	seen := checkBrokerOrder(t, b.streamEvents(t))
	if len(seen) != lanes*perLane {
		t.Fatalf("%d distinct events at the broker, want %d", len(seen), lanes*perLane)
	}
}
