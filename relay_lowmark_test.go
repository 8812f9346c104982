package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// TestFullScanLookFlatUnderPinnedXmin: under a transaction holding the
// xmin, the entries of every published event stay in outbox_dispatch_idx,
// and a look that reads it from the start walks all of them. The
// background full scan's look starts at its low-water mark instead, which
// moves up to the oldest pending event, or to a margin (two rescan
// intervals) before now: after 6,200 events published under the pin it
// reads what it read after 200, while the complete look, which runs every
// sixty rescan intervals as the backstop, reads every entry.
func TestFullScanLookFlatUnderPinnedXmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	pinXmin(t)
	cfg := quietConfig(schema, b.pub)
	cfg.BatchSize = 100
	cfg.RescanInterval = 50 * time.Millisecond // margin 100 ms, complete every 3 s
	r, _ := startRelay(t, pool, cfg)
	measure := func(n int) (bounded, complete claimPlan) {
		writeEvents(t, pool, w, 100, n/100)
		outboxtest.Eventually(t, 2*time.Minute, "all published", func() bool { return countUnpublished(t, pool, schema) == 0 })
		var last time.Time
		if err := pool.QueryRow(ctx, `SELECT max(available_at) FROM `+schema+`.outbox_events`).Scan(&last); err != nil {
			t.Fatal(err)
		}
		outboxtest.Eventually(t, time.Minute, "the low-water mark past the published events", func() bool { return r.LookLow().After(last) })
		for _, c := range []bool{false, true} {
			text, err := r.ExplainLook(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if c {
				complete = parsePlan(text)
			} else {
				bounded = parsePlan(text)
			}
		}
		return bounded, complete
	}
	bounded1, complete1 := measure(200)
	bounded2, complete2 := measure(6000)
	t.Logf("buffers of the look: from the low-water mark %d after 200 events, %d after 6,200; from the start %d, %d",
		bounded1.buffers, bounded2.buffers, complete1.buffers, complete2.buffers)
	if complete2.buffers < 4*complete1.buffers {
		t.Fatalf("the complete look read %d buffers after 6,200 events and %d after 200: the pinned xmin did not keep the dead entries", complete2.buffers, complete1.buffers)
	}
	// One walk of the dead entries: the complete look reads about what the
	// walk to the oldest pending event alone reads (both read the same
	// entries and their heap pages), not twice as much.
	rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) SELECT e.available_at FROM `+schema+`.outbox_events e
	WHERE e.published_at IS NULL AND e.quarantined_at IS NULL ORDER BY e.available_at, e.occurred_at LIMIT 1`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	walk := parsePlan(strings.Join(lines, "\n"))
	t.Logf("buffers of one walk of the index to the oldest pending event: %d", walk.buffers)
	if walk.seqScan || complete2.buffers > walk.buffers*3/2 {
		t.Fatalf("the complete look read %d buffers, one walk of the index %d: it walks the dead entries more than once\n%s",
			complete2.buffers, walk.buffers, complete2.text)
	}
	if bounded2.buffers > bounded1.buffers+50 {
		t.Fatalf("the look from the low-water mark read %d buffers after 6,200 events published under a pinned xmin, %d after 200: it walks settled history\n%s",
			bounded2.buffers, bounded1.buffers, bounded2.text)
	}
	if bounded2.seqScan {
		t.Fatalf("the look scans the table:\n%s", bounded2.text)
	}
}

// TestFullScanCompleteLookFindsWhatIsBehindTheMark: a pending event put
// behind the low-water mark by hand (an available_at an hour old, no
// dispatch_xid, so the incremental claim's cursor does not see it either)
// is not read by the looks from the mark; the complete look, every sixty
// rescan intervals, finds and publishes it.
func TestFullScanCompleteLookFindsWhatIsBehindTheMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	cfg := quietConfig(schema, b.pub)
	cfg.RescanInterval = 50 * time.Millisecond // margin 100 ms, complete every 3 s
	r, _ := startRelay(t, pool, cfg)
	writeEvents(t, pool, w, 3, 2)
	// A mark within the margin of now: the event below is behind it.
	outboxtest.Eventually(t, time.Minute, "a low-water mark set", func() bool {
		return r.LookLow().After(time.Now().Add(-30 * time.Minute))
	})
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events
		(event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes, occurred_at, available_at, dispatch_xid)
		VALUES (gen_random_uuid(), 'order', 'behind', 1, 'OrderCreated', '{}', now() - interval '1 hour', now() - interval '1 hour', NULL)`); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, time.Minute, "the event behind the mark published", func() bool { return countUnpublished(t, pool, schema) == 0 })
}
