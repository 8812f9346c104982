package outbox

// Claiming: one statement leases the heads of the oldest ready aggregates and
// their contiguous successors; the rows come back grouped into lanes.
// The argument: docs/design.md, "Claiming".

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pgoutbox/outbox/internal/failpoint"
)

// claimedEvent is a claimed row.
type claimedEvent struct {
	Message
	attempts    int   // attempt_count before this attempt
	undecodable error // the row could not be read into a Message
}

// batch is one claim's events and its fencing token.
type batch struct {
	token    uuid.UUID
	deadline time.Time // local time after which the lease may be gone
	lanes    [][]claimedEvent
	total    int
	// takenOver counts events claimed from an expired lease.
	takenOver int
}

func (r *Relay) claim(ctx context.Context) (batch, error) {
	b := batch{token: uuid.New()}
	start := time.Now()
	// The claim is one autocommit statement (one round trip). Only when
	// failpoints are enabled does it run in an explicit transaction, so that
	// relay/during-claim sits between the UPDATE and the COMMIT.
	var q interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	} = r.pool
	var tx pgx.Tx
	if failpoint.Enabled() {
		var err error
		if tx, err = r.pool.Begin(ctx); err != nil {
			return b, fmt.Errorf("claim batch: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		q = tx
	}
	rows, err := q.Query(ctx, r.sql.claim, r.cfg.BatchSize, r.cfg.ID, b.token, r.cfg.LeaseDuration.Milliseconds())
	if err != nil {
		return b, fmt.Errorf("claim batch: %w", err)
	}
	takenOver, err := scanClaimed(rows, &b)
	if err != nil {
		return b, err
	}
	if tx != nil {
		if b.total > 0 {
			if err := failpoint.Hit("relay/during-claim"); err != nil {
				return batch{}, fmt.Errorf("claim batch: %w", err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return batch{}, fmt.Errorf("claim batch: %w", err)
		}
	}
	r.takenOver.Add(takenOver)
	b.takenOver = int(takenOver)
	if cut := orderLanes(b.lanes); len(cut) > 0 {
		r.log.Error("claim returned a lane with a gap; releasing the events after it", slog.Int("events", len(cut)))
		b.total -= len(cut)
		if err := r.release(ctx, b, cut); err != nil {
			return b, err
		}
	}
	if err := r.quarantineUndecodable(ctx, &b); err != nil {
		return b, err
	}
	// Leave a safety margin: stop publishing well before the lease could have
	// been taken over, since the database clock and ours may differ slightly.
	b.deadline = start.Add(r.cfg.LeaseDuration * 8 / 10)
	r.claimed.Add(int64(b.total))
	return b, nil
}

// scanClaimed reads a claim's rows (messageColumns, attempt_count, the
// previous claimed_by) into b's lanes, in the order returned, and counts the
// events taken over from an expired lease. It closes rows.
func scanClaimed(rows pgx.Rows, b *batch) (takenOver int64, err error) {
	defer rows.Close()
	laneOf := map[[2]string]int{}
	for rows.Next() {
		var row messageRow
		var ev claimedEvent
		var prevOwner *string
		if err := rows.Scan(row.dest(&ev.attempts, &prevOwner)...); err != nil {
			return takenOver, fmt.Errorf("claim batch: %w", err)
		}
		ev.Message, ev.undecodable = row.decode()
		ev.Attempt = ev.attempts + 1
		if prevOwner != nil {
			takenOver++
		}
		key := [2]string{ev.AggregateType, ev.AggregateID}
		i, ok := laneOf[key]
		if !ok {
			i = len(b.lanes)
			laneOf[key] = i
			b.lanes = append(b.lanes, nil)
		}
		b.lanes[i] = append(b.lanes[i], ev)
		b.total++
	}
	if err := rows.Err(); err != nil {
		return takenOver, fmt.Errorf("claim batch: %w", err)
	}
	return takenOver, nil
}

func allIDs(b batch) []uuid.UUID {
	ids := make([]uuid.UUID, 0, b.total)
	for _, lane := range b.lanes {
		for _, ev := range lane {
			ids = append(ids, ev.ID)
		}
	}
	return ids
}
