package destinationtest

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// pipelining checks the promise of a publisher that declares ordered
// pipelining: in one call holding two aggregates' runs, a message the
// destination refuses (refuse) in the middle of one run fails, the run's
// later messages fail too and are not at the destination, and everything
// else is delivered in sequence order.
func pipelining(t *testing.T, d Destination, refuse func(Target) func(outbox.Message) outbox.Message) {
	tg := open(t, d.Open)
	op, ok := tg.Publisher.(outbox.OrderedPipeliner)
	if !ok || !op.OrderedPipelining() {
		t.Fatal("pipelining: the publisher does not declare ordered pipelining")
	}
	ctx := testCtx(t, time.Minute)
	var a, b []outbox.Message
	for seq := int64(1); seq <= 5; seq++ {
		a = append(a, message("pa", seq))
	}
	for seq := int64(1); seq <= 3; seq++ {
		b = append(b, message("pb", seq))
	}
	a[2] = refuse(tg)(a[2])
	msgs := append(append([]outbox.Message(nil), a...), b...)
	errs := tg.Publisher.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %v, want the refused message and those behind it to fail", errs)
	}
	for i, err := range errs {
		m := msgs[i]
		switch {
		case m.AggregateID == "pa" && m.Sequence < 3, m.AggregateID == "pb":
			if err != nil {
				t.Errorf("%s/%d: %v, want success", m.AggregateID, m.Sequence, err)
			}
		case m.Sequence == 3:
			if !outbox.IsPermanent(err) {
				t.Errorf("refused %s/%d: %v, want a permanent error", m.AggregateID, m.Sequence, err)
			}
		default:
			if err == nil {
				t.Errorf("%s/%d succeeded after its aggregate's event 3 failed", m.AggregateID, m.Sequence)
			}
		}
	}
	ds := read(t, ctx, tg, 5)
	last := map[string]int64{}
	notThere := map[uuid.UUID]bool{a[2].ID: true, a[3].ID: true, a[4].ID: true}
	for _, dv := range ds {
		m := dv.Message
		if notThere[m.ID] {
			t.Errorf("%s/%d is at the destination after its predecessor failed", m.AggregateID, m.Sequence)
		}
		if m.Sequence != last[m.AggregateID]+1 {
			t.Errorf("%s/%d delivered after %d", m.AggregateID, m.Sequence, last[m.AggregateID])
		}
		last[m.AggregateID] = m.Sequence
	}
	if last["pa"] != 2 || last["pb"] != 3 {
		t.Errorf("delivered pa through %d and pb through %d, want 2 and 3", last["pa"], last["pb"])
	}
}
