package outbox_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgtx"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// partitionedLanes makes a partitioned outbox of old+2+ahead partitions of
// a minute: old partitions before the conversion's (each holding one
// published event of every lane, as the settled partitions kept for the
// replay horizon do), the conversion's closed and current ones, and
// partitions made ahead of time (empty). Each of lanes lanes has one more
// published event and then pending ones in the current partition.
func partitionedLanes(t *testing.T, old, ahead, lanes, pending int) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	const interval = time.Minute
	pool, schema := outboxtest.PartitionedSchema(t, outboxmigrate.PartitionConfig{Interval: interval, Ahead: ahead})
	s := mustSchema(t, schema)
	parts, err := partman.List(ctx, pgtx.Pool(pool), s)
	if err != nil || len(parts) == 0 {
		t.Fatalf("partitions %v, %v", parts, err)
	}
	w := newWriter(t, schema)
	for k := old; k >= 1; k-- {
		from := parts[0].From.Add(-time.Duration(k) * interval)
		name, err := partman.Create(ctx, pgtx.Pool(pool), s, from, from.Add(interval), "")
		if err != nil {
			t.Fatal(err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			evs := make([]outbox.Event, lanes)
			for a := range evs {
				evs[a] = orderEvent("agg-"+strconv.Itoa(a), "Old")
				id := partman.Bound(from)
				id[6], id[8], id[14], id[15] = 0x70, 0x80, byte(a>>8), byte(a)
				evs[a].ID = id
			}
			_, err := w.InsertTx(ctx, tx, evs...)
			return err
		})
		if err != nil {
			t.Fatalf("events of %s: %v", name, err)
		}
	}
	// Each lane's last published event is recent, as in a busy outbox:
	// the heads' predecessors are in the current partition.
	writeEvents(t, pool, w, lanes, 1)
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	writeEvents(t, pool, w, lanes, pending)
	if _, err := pool.Exec(ctx, `ANALYZE `+schema+`.outbox_events`); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

// claimCosts measures the relay's claim statements on a fresh relay.
func claimCosts(t *testing.T, pool *pgxpool.Pool, schema string, raw bool) map[string]outbox.ClaimCost {
	t.Helper()
	cfg := quietConfig(schema, discardPublisher{})
	cfg.BatchSize = 100
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]outbox.ClaimCost{}
	for _, which := range []string{"claim", "fresh", "look"} {
		// The second run is measured: the first may read the catalogue
		// and the partitions' pages in.
		for range 2 {
			c, err := outbox.ClaimCostOf(context.Background(), r, which, raw)
			if err != nil {
				t.Fatalf("%s: %v", which, err)
			}
			out[which] = c
		}
	}
	return out
}

// The claims' lookups by lane key on a partitioned outbox read the
// partitions near the events' ids, not every partition: with 30 partitions
// (14 settled ones kept for the horizon, 14 made ahead) the full scan's
// claim and the incremental claim read at most 1.25 times the buffers they
// read with 4 (measured: 1.1 and 1.05), where the plain statements, each
// lookup probing every partition, read 2.5 to 3 times as many.
func TestPartitionedClaimLookupsDoNotGrowWithPartitions(t *testing.T) {
	t.Parallel()
	costs := map[int]map[string]outbox.ClaimCost{}
	plain := map[int]map[string]outbox.ClaimCost{}
	for _, n := range []int{4, 30} {
		old := (n - 2) / 2
		pool, schema := partitionedLanes(t, old, n-2-old, 300, 3)
		plain[n] = claimCosts(t, pool, schema, true)
		costs[n] = claimCosts(t, pool, schema, false)
	}
	for _, which := range []string{"claim", "fresh"} {
		t.Logf("%s: buffers with 4 and 30 partitions: plain statements %d, %d; partitioned ones %d, %d", which,
			plain[4][which].Buffers, plain[30][which].Buffers, costs[4][which].Buffers, costs[30][which].Buffers)
	}
	for _, which := range []string{"claim", "fresh"} {
		if b4, b30 := costs[4][which].Buffers, costs[30][which].Buffers; 4*b30 > 5*b4 {
			t.Errorf("%s read %d buffers with 30 partitions, %d with 4: want at most 1.25 times as many", which, b30, b4)
		}
	}
}

// seenPublisher records the events handed to it.
type seenPublisher struct {
	mu   sync.Mutex
	seen []outbox.Message
}

func (p *seenPublisher) Publish(_ context.Context, msgs []outbox.Message) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, msgs...)
	return make([]error, len(msgs))
}

func (p *seenPublisher) saw(agg string, seq int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.seen {
		if m.AggregateID == agg && m.Sequence == seq {
			return true
		}
	}
	return false
}

// On a partitioned outbox a lane's ids need not follow its sequences (a
// writer that waited for the lane's lock made its id first; a caller's
// own id): the claim's head check finds an unpublished predecessor whose id
// is minutes away all the same. Each lane's first event backs off for an
// hour, and its second, whose id is far from the first's (after it in one
// lane, before it in the other), is never handed to the destination while
// later lanes are published. (With the near lookup alone, without its
// fallback to every partition, the second events went out.)
func TestPartitionedClaimKeepsOrderWithIDsFarApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, far := partitionedWithFarIDs(t)
	w := newWriter(t, schema)
	for _, ev := range []struct {
		agg string
		id  uuid.UUID
	}{{"old-first", far(1)}, {"old-first", uuid.Nil}, {"old-second", uuid.Nil}, {"old-second", far(2)}} {
		if err := insertWithID(t, pool, w, ev.agg, ev.id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET available_at = now() + interval '1 hour'
WHERE aggregate_sequence = 1 AND aggregate_id LIKE 'old-%'`); err != nil {
		t.Fatal(err)
	}
	pub := &seenPublisher{}
	startRelay(t, pool, quietConfig(schema, pub))
	for range 2 {
		if err := insertWithID(t, pool, w, "later", uuid.Nil); err != nil {
			t.Fatal(err)
		}
	}
	outboxtest.Eventually(t, 30*time.Second, "a later lane's second event published", func() bool { return pub.saw("later", 2) })
	for _, agg := range []string{"old-first", "old-second"} {
		if pub.saw(agg, 2) {
			t.Errorf("lane %s: its second event was handed to the destination while its first is pending", agg)
		}
	}
}

// partitionedWithFarIDs is a partitioned outbox with a partition five
// minutes before its first, and far(n): the n-th id there, outside any
// event's near window.
func partitionedWithFarIDs(t *testing.T) (*pgxpool.Pool, string, func(n byte) uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	s := mustSchema(t, schema)
	parts, err := partman.List(ctx, pgtx.Pool(pool), s)
	if err != nil || len(parts) == 0 {
		t.Fatalf("partitions %v, %v", parts, err)
	}
	from := parts[0].From.Add(-5 * time.Minute)
	if _, err := partman.Create(ctx, pgtx.Pool(pool), s, from, from.Add(10*time.Second), ""); err != nil {
		t.Fatal(err)
	}
	return pool, schema, func(n byte) uuid.UUID {
		id := partman.Bound(from)
		id[6], id[8], id[15] = 0x70, 0x80, n
		return id
	}
}
