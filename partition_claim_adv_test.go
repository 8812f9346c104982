package outbox_test

import (
	"context"
	"strconv"
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

// PublishIDs on a partitioned outbox: its claim (claimIDsSQL) is rewritten
// by partitionedSQL like the relay's, and its heads come from the CTE
// lowest, which has no event_id to bound a near lookup by. A lane given
// whole is published whole, in order; a lane given from its second event
// publishes nothing while its first is pending.
func TestPartitionedPublishIDsClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	w := newWriter(t, schema)
	recs := writeEvents(t, pool, w, 2, 2) // agg-0, agg-1; recs[round*2+agg]
	pub := &seenPublisher{}
	r, err := outbox.NewRelay(pool, quietConfig(schema, pub))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.PublishIDs(ctx, []uuid.UUID{recs[0].ID, recs[2].ID, recs[3].ID})
	if err != nil {
		t.Fatalf("PublishIDs on a partitioned outbox: %v", err)
	}
	if res.Published != 2 || res.Left != 1 {
		t.Fatalf("result %+v; want agg-0 1..2 published, agg-1's 2 left behind its pending 1", res)
	}
	if pub.saw("agg-1", 2) || !pub.saw("agg-0", 1) || !pub.saw("agg-0", 2) {
		t.Fatalf("handed to the destination: %+v", pub.seen)
	}
}

// Every statement partitionedSQL rewrites prepares on a partitioned outbox,
// for a relay and for a safety net beside a CDC stream (ReconcileAfter,
// whose claims carry a further condition on their heads). Before the fix
// claimIDs failed: its heads (the CTE lowest) had no event_id.
func TestPartitionedRewrittenStatementsPrepare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.PartitionedSchema(t, tenSeconds)
	for _, reconcile := range []time.Duration{0, time.Second} {
		cfg := quietConfig(schema, &seenPublisher{})
		cfg.ReconcileAfter = reconcile
		r, err := outbox.NewRelay(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.PrepareRewrittenClaims(ctx, r); err != nil {
			t.Errorf("ReconcileAfter %v: %v", reconcile, err)
		}
	}
}

// partitionedQuietLanes is partitionedLanes without the recent published
// event: each lane's last published event is in the newest of the old
// partitions, more than a minute before its pending ones.
func partitionedQuietLanes(t *testing.T, old, ahead, lanes, pending int) (*pgxpool.Pool, string) {
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
		if _, err := partman.Create(ctx, pgtx.Pool(pool), s, from, from.Add(interval), ""); err != nil {
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
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	writeEvents(t, pool, w, lanes, pending)
	if _, err := pool.Exec(ctx, `ANALYZE `+schema+`.outbox_events`); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

// Lanes whose ids are minutes apart on a partitioned outbox, against a
// running relay: a successor whose id is five minutes older than its head's
// (outside the successors' lower bound) is not claimed with the head but
// goes out after it, not stranded; a skipped predecessor five minutes away
// from its successor, either way round, still gives the successor its
// SkippedFrom (the skip probe's fallback to every partition).
func TestPartitionedClaimFarIDsSuccessorsAndSkips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, far := partitionedWithFarIDs(t)
	w := newWriter(t, schema)
	lanes := []struct {
		agg    string
		first  uuid.UUID
		second uuid.UUID
		skip   bool
	}{
		{"succ-older", uuid.Nil, far(1), false},
		{"skip-far-before", far(2), uuid.Nil, true},
		{"skip-far-after", uuid.Nil, far(3), true},
	}
	a := newAdmin(t, pool, schema)
	for _, l := range lanes {
		if err := insertWithID(t, pool, w, l.agg, l.first); err != nil {
			t.Fatal(err)
		}
		if err := insertWithID(t, pool, w, l.agg, l.second); err != nil {
			t.Fatal(err)
		}
		if !l.skip {
			continue
		}
		var id uuid.UUID
		if err := pool.QueryRow(ctx, `UPDATE `+schema+`.outbox_events SET quarantined_at = now()
WHERE aggregate_id = $1 AND aggregate_sequence = 1 RETURNING event_id`, l.agg).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Skip(ctx, id, "test", "far ids"); err != nil {
			t.Fatal(err)
		}
	}
	pub := &seenPublisher{}
	startRelay(t, pool, quietConfig(schema, pub))
	outboxtest.Eventually(t, 30*time.Second, "every lane's second event published", func() bool {
		for _, l := range lanes {
			if !pub.saw(l.agg, 2) {
				return false
			}
		}
		return true
	})
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for _, l := range lanes {
		var seqs []int64
		for _, m := range pub.seen {
			if m.AggregateID != l.agg {
				continue
			}
			seqs = append(seqs, m.Sequence)
			if m.Sequence == 2 && l.skip && m.SkippedFrom == 0 {
				t.Errorf("lane %s: its second event went out without SkippedFrom after its first was skipped", l.agg)
			}
		}
		want := []int64{1, 2}
		if l.skip {
			want = []int64{2}
		}
		if len(seqs) != len(want) || seqs[0] != want[0] {
			t.Errorf("lane %s: handed out %v, want %v", l.agg, seqs, want)
		}
	}
}

// PublishIDs on a partitioned outbox with a lane whose ids are five minutes
// apart, either way round: given the second event alone while the first is
// pending, it publishes nothing (the head check's fallback finds the
// pending predecessor outside the near window); given both, it publishes
// both, in order.
func TestPartitionedPublishIDsFarIDsKeepOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, far := partitionedWithFarIDs(t)
	w := newWriter(t, schema)
	ids := map[string][]uuid.UUID{}
	for _, l := range []struct {
		agg           string
		first, second uuid.UUID
	}{{"far-first", far(1), uuid.Nil}, {"far-second", uuid.Nil, far(2)}} {
		for _, id := range []uuid.UUID{l.first, l.second} {
			if err := insertWithID(t, pool, w, l.agg, id); err != nil {
				t.Fatal(err)
			}
		}
		var got []uuid.UUID
		if err := pool.QueryRow(ctx, `SELECT array_agg(event_id ORDER BY aggregate_sequence) FROM `+schema+`.outbox_events
WHERE aggregate_id = $1`, l.agg).Scan(&got); err != nil {
			t.Fatal(err)
		}
		ids[l.agg] = got
	}
	pub := &seenPublisher{}
	r, err := outbox.NewRelay(pool, quietConfig(schema, pub))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.PublishIDs(ctx, []uuid.UUID{ids["far-first"][1], ids["far-second"][1]})
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 0 {
		t.Fatalf("second events alone: %+v; want nothing published while the first events are pending", res)
	}
	res, err = r.PublishIDs(ctx, append(ids["far-first"], ids["far-second"]...))
	if err != nil {
		t.Fatal(err)
	}
	if res.Published != 4 {
		t.Fatalf("whole lanes: %+v; want 4 published", res)
	}
	if err := r.WaitPublishIDs(ctx); err != nil {
		t.Fatal(err)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	next := map[string]int64{}
	for _, m := range pub.seen {
		if m.Sequence != next[m.AggregateID]+1 {
			t.Errorf("lane %s: sequence %d handed out after %d", m.AggregateID, m.Sequence, next[m.AggregateID])
		}
		next[m.AggregateID] = m.Sequence
	}
}
