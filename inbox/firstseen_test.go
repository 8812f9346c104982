package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
)

// event is an event of aggregate id that occurred at at, with a UUIDv7 id as
// the writer gives it.
func event(t *testing.T, id string, seq int64, at time.Time) outbox.Message {
	t.Helper()
	u, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	return outbox.Message{ID: u, AggregateType: "order", AggregateID: id, Sequence: seq, Type: "T", OccurredAt: at}
}

// Issue 19, item 4: a consumer with StartAtFirstSeen and two workers; 30
// aggregates created after it started, each of whose event 2 is handled
// before its event 1 (worker B gets every event 2; worker A gets event 1 of
// an aggregate only once B has handled that aggregate's event 2). Every
// event 1 must be applied, none answered Duplicate, and each aggregate's
// events applied in order. Before the fix, event 2 started the aggregate
// (first seen) and event 1 was then dropped as a Duplicate.
func TestStartAtFirstSeenAppliesEventOneOfNewAggregates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupStart(t, inbox.Config{StartAtFirstSeen: true})
	if _, err := b.pool.Exec(ctx, "CREATE TABLE "+b.schema+".applied (n bigserial, agg text, seq bigint)"); err != nil {
		t.Fatal(err)
	}
	// The consumer is running (its start point recorded) before the
	// aggregates are created.
	b.deliver(t, event(t, "warm-up", 1, time.Now()), inbox.Applied)

	const n = 30
	type delivery struct {
		m     outbox.Message
		first bool // the first delivery of m
	}
	ones, twos := make([]outbox.Message, n), make([]outbox.Message, n)
	handledTwo := make([]chan struct{}, n) // closed once B handled event 2 of aggregate i
	for i := range n {
		id := fmt.Sprintf("o-%02d", i)
		ones[i] = event(t, id, 1, time.Now())
		twos[i] = event(t, id, 2, time.Now())
		handledTwo[i] = make(chan struct{})
	}
	var mu sync.Mutex
	outcomes := map[string][]inbox.Outcome{} // "o-07#2" -> outcomes, in order
	handle := func(m outbox.Message) inbox.Outcome {
		got, err := b.in.Handle(ctx, m, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+b.schema+".applied (agg, seq) VALUES ($1, $2)", m.AggregateID, m.Sequence)
			return err
		})
		if err != nil {
			t.Errorf("handle %s#%d: %v", m.AggregateID, m.Sequence, err)
			return inbox.Duplicate // stop redelivering it
		}
		mu.Lock()
		k := fmt.Sprintf("%s#%d", m.AggregateID, m.Sequence)
		outcomes[k] = append(outcomes[k], got)
		mu.Unlock()
		return got
	}
	// A worker takes its queue in order; an Early delivery comes again at
	// the queue's end, as a nak'ed message does.
	worker := func(queue []outbox.Message, before func(i int), after func(i int)) {
		idx := map[string]int{}
		for i, m := range queue {
			idx[m.AggregateID] = i
		}
		var q []delivery
		for _, m := range queue {
			q = append(q, delivery{m, true})
		}
		for len(q) > 0 {
			d := q[0]
			q = q[1:]
			i := idx[d.m.AggregateID]
			if d.first && before != nil {
				before(i)
			}
			got := handle(d.m)
			if d.first && after != nil {
				after(i)
			}
			if got == inbox.Early {
				q = append(q, delivery{d.m, false})
			}
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // worker A: event 1 of each aggregate, after B handled its event 2
		defer wg.Done()
		worker(ones, func(i int) { <-handledTwo[i] }, nil)
	}()
	go func() { // worker B: event 2 of each aggregate
		defer wg.Done()
		worker(twos, nil, func(i int) { close(handledTwo[i]) })
	}()
	wg.Wait()

	for i := range n {
		id := ones[i].AggregateID
		one, two := outcomes[id+"#1"], outcomes[id+"#2"]
		if len(one) != 1 || one[0] != inbox.Applied {
			t.Errorf("%s: event 1 answered %v, want applied", id, one)
		}
		if two[0] != inbox.Early || two[len(two)-1] != inbox.Applied {
			t.Errorf("%s: event 2 answered %v, want early first (event 1 not applied yet), then applied", id, two)
		}
		for _, o := range append(one, two...) {
			if o == inbox.Duplicate {
				t.Errorf("%s: an event answered duplicate: event 1 %v, event 2 %v", id, one, two)
				break
			}
		}
		if a := b.aggregate(t, id); a.LastSequence != 2 || a.Start != nil {
			t.Errorf("%s: mark %d, start %+v; want 2 and no mid-stream start", id, a.LastSequence, a.Start)
		}
	}
	rows, err := b.pool.Query(ctx, "SELECT agg, string_agg(seq::text, ',' ORDER BY n) FROM "+b.schema+".applied WHERE agg <> 'warm-up' GROUP BY agg")
	if err != nil {
		t.Fatal(err)
	}
	order, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Agg, Seqs string }])
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != n {
		t.Errorf("%d aggregates applied, want %d", len(order), n)
	}
	for _, o := range order {
		if o.Seqs != "1,2" {
			t.Errorf("%s applied in the order %s, want 1,2", o.Agg, o.Seqs)
		}
	}
}

// The mid-stream start is kept for aggregates whose history began before
// the consumer's start point: an event that occurred before it (by its
// OccurredAt, or by its UUIDv7 id when it has none) starts its aggregate at
// once. An aggregate with an event after the start point whose earlier
// events never come (they were published before the consumer subscribed)
// waits, Early and listed as waiting, then starts at the lowest sequence
// seen once StartGrace has passed since its first delivery.
func TestStartAtFirstSeenBeforeAndAfterTheStartPoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupStart(t, inbox.Config{StartAtFirstSeen: true, StartGrace: time.Hour})
	start, err := b.in.StartPoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := b.in.StartPoint(ctx); err != nil || !again.Equal(start) {
		t.Fatalf("start point moved: %v then %v (%v)", start, again, err)
	}
	old := start.Add(-time.Hour)

	b.deliver(t, event(t, "old", 5, old), inbox.Applied)
	b.deliver(t, event(t, "old", 4, old), inbox.Duplicate) // below the start: the existing semantics
	if a := b.aggregate(t, "old"); a.Start == nil || a.Start.Kind != inbox.StartFirstSeen || a.Start.Mark != 4 {
		t.Fatalf("old: %+v start %+v; want started first_seen at 4", a, a.Start)
	}
	// No OccurredAt: the UUIDv7 id's time says.
	v7 := event(t, "old-by-id", 3, time.Time{})
	copy(v7.ID[:6], []byte{byte(old.UnixMilli() >> 40), byte(old.UnixMilli() >> 32), byte(old.UnixMilli() >> 24),
		byte(old.UnixMilli() >> 16), byte(old.UnixMilli() >> 8), byte(old.UnixMilli())})
	b.deliver(t, v7, inbox.Applied)

	// A straddler: #3 occurred after the start, #1-#2 never come.
	late := event(t, "straddler", 3, time.Now())
	b.deliver(t, late, inbox.Early)
	b.deliver(t, late, inbox.Early)
	if a := b.aggregate(t, "straddler"); a.Wait == nil || a.Wait.Expected != 1 || a.Wait.Seen != 3 || a.Start != nil {
		t.Fatalf("straddler: %+v wait %+v; want waiting for 1, seen 3", a, a.Wait)
	}
	// StartGrace passes (an hour, moved in the database rather than waited).
	if _, err := b.pool.Exec(ctx, "UPDATE "+b.schema+".inbox_aggregates SET waiting_since = now() - interval '61 minutes' WHERE aggregate_id = 'straddler'"); err != nil {
		t.Fatal(err)
	}
	b.deliver(t, event(t, "straddler", 4, time.Now()), inbox.Early) // not the lowest seen
	b.deliver(t, late, inbox.Applied)
	a := b.aggregate(t, "straddler")
	if a.LastSequence != 3 || a.Wait != nil || a.Start == nil || a.Start.Kind != inbox.StartFirstSeen || a.Start.Mark != 2 ||
		!strings.Contains(a.Start.Reason, "StartGrace") {
		t.Fatalf("straddler after StartGrace: %+v start %+v wait %+v; want started first_seen at 2, the grace in the reason", a, a.Start, a.Wait)
	}
}

// Seed at 0 is meaningful: it says the aggregate's history starts at
// sequence 1, so StartAtFirstSeen does not start it mid-stream even for an
// event from before the consumer's start point. Before the fix Seed(…, 0,
// …) recorded nothing and the aggregate was started at the first event
// seen.
func TestSeedAtZeroKeepsAnAggregateStrict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupStart(t, inbox.Config{StartAtFirstSeen: true})
	if err := b.in.Seed(ctx, "order", "o9", 0, "created by this service: its consumer needs every event"); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	b.deliver(t, event(t, "o9", 2, old), inbox.Early)
	a := b.aggregate(t, "o9")
	if s := a.Start; s == nil || s.Kind != inbox.StartSeeded || s.Mark != 0 || s.PriorMark != 0 || a.Wait == nil {
		t.Fatalf("o9: %+v start %+v wait %+v; want seeded at 0 and waiting for 1", a, a.Start, a.Wait)
	}
	if err := b.in.Seed(ctx, "order", "o9", 0, "again"); err != nil {
		t.Fatalf("a second seed at 0: %v", err)
	}
	if s := b.aggregate(t, "o9").Start; s.Reason != "created by this service: its consumer needs every event" {
		t.Fatalf("a second seed at 0 changed the start: %+v", s)
	}
	b.deliver(t, event(t, "o9", 1, old), inbox.Applied)
	b.deliver(t, event(t, "o9", 2, old), inbox.Applied)
	if got := b.effects(t); !equalSeqs(got, []int64{1, 2}) {
		t.Fatalf("effects %v, want [1 2]", got)
	}
}
