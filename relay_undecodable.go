package outbox

// Undecodable rows: a row the relay cannot read is quarantined alone.

import (
	"context"
	"log/slog"

	"github.com/google/uuid"
)

// undecodableHead reports whether a lane of b starts with a row that could
// not be read (quarantineUndecodable quarantines it).
func (b *batch) undecodableHead() bool {
	for _, lane := range b.lanes {
		if len(lane) > 0 && lane[0].undecodable != nil {
			return true
		}
	}
	return false
}

// quarantineUndecodable takes the rows of b that could not be read into a
// Message (headers written by hand that are not a JSON object of strings)
// out of the batch. A lane's head (its first event in the batch: the claim
// found its predecessor published) is quarantined, with the reason in
// last_error, so that an operator sees and repairs or skips it; the events
// claimed behind it in its lane are released: they wait behind it, as
// behind any other quarantined event. A row further down its lane is not
// quarantined: an earlier event of its aggregate is in the batch,
// unpublished, and a quarantined event behind an unsettled one is what let
// an operator's skip publish k+2 before k (issue 19, item 2). It is
// released with the events behind it, unattempted, and waits until it is
// the head of its lane; the events before it are published as usual. Every
// other lane is published as usual.
func (r *Relay) quarantineUndecodable(ctx context.Context, b *batch) error {
	var bad []failure
	var behind []uuid.UUID
	lanes := b.lanes[:0]
	for _, lane := range b.lanes {
		for j, ev := range lane {
			if ev.undecodable == nil {
				continue
			}
			attrs := []any{slog.String("event_id", ev.ID.String()), slog.String("aggregate_type", ev.AggregateType),
				slog.String("aggregate_id", ev.AggregateID), slog.Int64("sequence", ev.Sequence), slog.Any("error", ev.undecodable)}
			first := j + 1 // lane[first:] is released
			if j == 0 {
				r.failed.Add(1)
				r.quarantined.Add(1)
				r.log.Error("event quarantined: the relay cannot read its row", attrs...)
				bad = append(bad, failure{id: ev.ID, attempts: 1, quarantine: true, err: truncate(ev.undecodable.Error(), 2000)})
			} else {
				r.log.Warn("the relay cannot read an event's row; it waits until the events before it are published", attrs...)
				first = j
			}
			for _, after := range lane[first:] {
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
	if len(bad) == 0 && len(behind) == 0 {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	if len(bad) == 0 {
		return r.release(ctx, *b, behind)
	}
	return r.settleAll(ctx, *b, nil, bad, behind)
}
