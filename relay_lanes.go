package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// orderLanes puts each lane's events in sequence order (the claim statement
// returns rows in no particular order) and cuts a lane at its first gap. The
// claim only ever returns a head and its contiguous successors, so a gap
// cannot happen; the cut is a second line of defence for invariant I5: the
// relay never publishes k+2 of an aggregate without k+1 before it. It returns
// the ids of the events cut off, which the caller releases.
func orderLanes(lanes [][]claimedEvent) (cut []uuid.UUID) {
	for i, lane := range lanes {
		if len(lane) < 2 {
			continue
		}
		slices.SortFunc(lane, func(a, b claimedEvent) int {
			switch {
			case a.Sequence < b.Sequence:
				return -1
			case a.Sequence > b.Sequence:
				return 1
			}
			return 0
		})
		for j := 1; j < len(lane); j++ {
			if lane[j].Sequence != lane[j-1].Sequence+1 {
				for _, ev := range lane[j:] {
					cut = append(cut, ev.ID)
				}
				lanes[i] = lane[:j]
				break
			}
		}
	}
	return cut
}

// settleAll writes a batch's outcome when some of it failed or was not
// attempted: marks, failures and releases go in one transaction (one round
// trip, a pipelined batch). With a head and its successors in one batch, a
// lane's published events, its failed event and the events claimed behind
// that one are settled together, so no reader (another relay, an operator's
// status) sees the failure, or a quarantine, while the events behind it are
// still leased, nor some of the batch settled and the rest not.
func (r *Relay) settleAll(ctx context.Context, b batch, published []uuid.UUID, fs []failure, unsent []uuid.UUID) error {
	ids := make([]uuid.UUID, len(fs))
	delays := make([]int64, len(fs))
	attempts := make([]int32, len(fs))
	msgs := make([]string, len(fs))
	quarantine := make([]bool, len(fs))
	for i, f := range fs {
		ids[i], delays[i], attempts[i], msgs[i], quarantine[i] = f.id, f.delay.Milliseconds(), int32(f.attempts), f.err, f.quarantine
	}
	type op struct {
		kind SettleOp
		name string
		n    int
		tag  pgconn.CommandTag
	}
	var ops []*op
	// A batch runs as one implicit transaction: all or nothing.
	var q pgx.Batch
	if len(published) > 0 {
		q.Queue(r.sql.markPublished, uuidArgs(published), b.token)
		ops = append(ops, &op{kind: SettleMarkPublished, name: "mark published", n: len(published)})
	}
	if len(fs) > 0 {
		q.Queue(r.sql.markFailed, uuidArgs(ids), delays, attempts, msgs, quarantine, b.token)
		ops = append(ops, &op{kind: SettleRecordFailures, name: "record failures", n: len(fs)})
	}
	if len(unsent) > 0 {
		q.Queue(r.sql.release, uuidArgs(unsent), b.token)
		ops = append(ops, &op{kind: SettleRelease, name: "release", n: len(unsent)})
	}
	start := time.Now()
	res := r.pool.SendBatch(ctx, &q)
	var err error
	for _, o := range ops {
		if o.tag, err = res.Exec(); err != nil {
			break
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	for _, o := range ops {
		r.observeSettle(o.kind, o.n, o.tag.RowsAffected(), start, err)
	}
	if err != nil {
		return fmt.Errorf("settle batch: %w", err)
	}
	for _, o := range ops {
		if o.kind == SettleMarkPublished {
			r.published.Add(o.tag.RowsAffected())
		}
		r.noteConflicts(o.name, o.n, o.tag.RowsAffected())
	}
	return nil
}

// uuidArgs passes event ids to PostgreSQL as raw 16-byte values: pgx sends
// a uuid.UUID through its driver.Valuer (a string per id, parsed back by the
// server), which showed up at several percent of a relay's CPU.
func uuidArgs(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

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
