package inbox_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
)

// Security review of issue 19, item 4: a writer transaction open since
// before the consumer's start point creates an aggregate (events 1 and 2)
// and commits after it. Both events' occurred_at is the transaction's
// start, before the start point; their commit, and so their delivery, is
// after it. When event 2 is handled first (two workers), it must wait for
// event 1 (Early), and event 1 must then be applied: the aggregate began
// after the consumer. Before the fix, event 2 counted as history, started
// the aggregate at 2, and event 1 was dropped as a Duplicate.
func TestStartAtFirstSeenWriterOpenAcrossTheStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupStart(t, inbox.Config{StartAtFirstSeen: true})
	// The skew margin (a minute) is for clocks; here both are the same
	// database's, and the test would otherwise hold its writer a minute.
	inbox.SetStartSkew(b.in, 0)
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: b.schema})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	recs, err := w.InsertTx(ctx, tx,
		outbox.Event{AggregateType: "order", AggregateID: "slow-1", Type: "OrderPlaced", Payload: []byte(`{}`)},
		outbox.Event{AggregateType: "order", AggregateID: "slow-1", Type: "OrderPaid", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	// The consumer starts while the writer's transaction is open.
	start, err := b.in.StartPoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if start.After(recs[0].OccurredAt) {
		t.Errorf("start point %v after the start of a transaction open at that moment (%v)", start, recs[0].OccurredAt)
	}
	msg := func(r outbox.Recorded) outbox.Message {
		return outbox.Message{ID: r.ID, AggregateType: "order", AggregateID: "slow-1", Sequence: r.Sequence, Type: "T", OccurredAt: r.OccurredAt}
	}
	one, two := msg(recs[0]), msg(recs[1])
	b.deliver(t, two, inbox.Early) // worker B, first
	b.deliver(t, one, inbox.Applied)
	b.deliver(t, two, inbox.Applied)
	var n int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".effects").Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d effects (%v), want both events applied", n, err)
	}
	if a := b.aggregate(t, "slow-1"); a.LastSequence != 2 || a.Start != nil {
		t.Fatalf("slow-1: %+v start %+v; want last 2, started normally at 1", a, a.Start)
	}
}
