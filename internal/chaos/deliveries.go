package chaos

import (
	"strconv"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// Violator records a violation of an invariant (Report.Violate has this
// shape), so that the checks below serve any harness: the chaos run's
// Check and the interleaving search of package outbox's tests.
type Violator func(inv, format string, args ...any)

// DeliveryOrder checks I5 at the destination on msgs, every message the
// destination holds in the order it holds them per aggregate: the first
// delivery of each event of an aggregate comes in sequence order, without
// a gap, except over events an operator skipped (skipped reports them; nil
// means none were). A later repeat of an event (a stale relay, a replay, a
// lost ack) is a duplicate, which the consumers' inboxes drop, and is not
// checked. It returns the number of deliveries of each event id.
func DeliveryOrder(msgs []outbox.Message, skipped func(aggregateType, aggregateID string, seq int64) bool, violate Violator) map[uuid.UUID]int {
	next := map[[2]string]int64{} // per aggregate, the highest sequence first delivered
	seen := map[uuid.UUID]int{}
	for _, m := range msgs {
		seen[m.ID]++
		if seen[m.ID] > 1 {
			continue
		}
		key := [2]string{m.AggregateType, m.AggregateID}
		want := next[key] + 1
		for skipped != nil && want < m.Sequence && skipped(m.AggregateType, m.AggregateID, want) {
			want++
		}
		if m.Sequence != want {
			violate("I5", "aggregate %s/%s: sequence %d first reached the destination when %d was next", m.AggregateType, short(m.AggregateID), m.Sequence, want)
		}
		next[key] = max(next[key], m.Sequence)
	}
	return seen
}

// short abbreviates a long aggregate id for a report line.
func short(id string) string {
	if len(id) <= 40 {
		return id
	}
	return id[:16] + "…(" + strconv.Itoa(len(id)) + " bytes)"
}
