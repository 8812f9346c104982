package outbox

// Undecodable rows: a row the relay cannot read is quarantined alone.

import (
	"context"
	"log/slog"

	"github.com/google/uuid"
)

// quarantineUndecodable takes the rows of b that could not be read into a
// Message (headers written by hand that are not a JSON object of strings)
// out of the batch and quarantines them, with the reason in last_error, so
// that an operator sees and repairs or skips them. The events claimed behind
// one in its lane are released: they wait behind the quarantined event, as
// behind any other. Every other lane is published as usual.
func (r *Relay) quarantineUndecodable(ctx context.Context, b *batch) error {
	var bad []failure
	var behind []uuid.UUID
	lanes := b.lanes[:0]
	for _, lane := range b.lanes {
		for j, ev := range lane {
			if ev.undecodable == nil {
				continue
			}
			r.failed.Add(1)
			r.quarantined.Add(1)
			r.log.Error("event quarantined: the relay cannot read its row", slog.String("event_id", ev.ID.String()),
				slog.String("aggregate_type", ev.AggregateType), slog.String("aggregate_id", ev.AggregateID),
				slog.Int64("sequence", ev.Sequence), slog.Any("error", ev.undecodable))
			bad = append(bad, failure{id: ev.ID, attempts: 1, quarantine: true, err: truncate(ev.undecodable.Error(), 2000)})
			for _, after := range lane[j+1:] {
				behind = append(behind, after.ID)
			}
			b.total -= len(lane) - j
			lane = lane[:j]
			break
		}
		if len(lane) > 0 {
			lanes = append(lanes, lane)
		}
	}
	b.lanes = lanes
	if len(bad) == 0 {
		return nil
	}
	return r.settleAll(context.WithoutCancel(ctx), *b, nil, bad, behind)
}
