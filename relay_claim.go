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

// querier is what the relay's queries need: a pool, a connection or a
// transaction of pgx.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

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
	// leaseEnd is when the lease ends by this process's clock, at the
	// latest: the claim's now() is no earlier than the moment it was sent.
	// A settle that lost its connection is retried until then.
	leaseEnd time.Time
	lanes    [][]claimedEvent
	total    int
	// takenOver counts events claimed from an expired lease.
	takenOver int
	// more: the incremental claim's range scan filled its window and its
	// cursor passed everything it read (events of lanes blocked elsewhere,
	// leased, locked): more events are committed past its window, and the
	// next claim reads them at once instead of after PollInterval. A lane
	// set aside ahead of the cursor (claimCursor.ahead) waits for it.
	more bool
}

// claim claims the next batch: the incremental claim, or the full scan when
// it is due. A full scan after the relay's first runs in the background
// (relay_fullscan.go), so that however long it takes (it walks the entries
// that vacuum cannot remove while a transaction is held open) the relay
// goes on claiming what is new meanwhile.
func (r *Relay) claim(ctx context.Context) (batch, error) {
	kind := r.claimKind(time.Now())
	if kind == claimFull && r.backgroundFullScan() {
		r.startFullScan()
		kind = claimFresh
	}
	return r.claimKind1(ctx, kind)
}

// claimKind1 runs one claim of the given kind.
func (r *Relay) claimKind1(ctx context.Context, kind claimKind) (batch, error) {
	b := batch{token: uuid.New()}
	start := time.Now()
	// The claim is one autocommit statement (one round trip). Only when
	// failpoints are enabled does it run in an explicit transaction, so that
	// relay/during-claim sits between the UPDATE and the COMMIT.
	var q querier = r.pool
	var tx pgx.Tx
	if failpoint.Enabled() {
		var err error
		if tx, err = r.pool.Begin(ctx); err != nil {
			return b, fmt.Errorf("claim batch: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		q = tx
	}
	q = r.plannedQ(q)
	var takenOver int64
	var err error
	switch kind {
	case claimFresh:
		takenOver, err = r.claimFresh(ctx, q, &b)
	case claimFullLooked:
		takenOver, err = r.claimLooked(ctx, q, &b)
	default:
		var rows pgx.Rows
		if rows, err = q.Query(ctx, r.sql.claim, r.cfg.BatchSize, r.cfg.ID, b.token, r.cfg.LeaseDuration.Milliseconds()); err != nil {
			return b, fmt.Errorf("claim batch: %w", err)
		}
		takenOver, err = scanClaimed(rows, &b)
	}
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
	if kind != claimFresh {
		r.cursor.fullDone(start, time.Since(start), b.total, r.cfg.BatchSize)
	}
	r.cursor.claimedLanes(b)
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
	b.leaseEnd = start.Add(r.cfg.LeaseDuration)
	r.claimed.Add(int64(b.total))
	return b, nil
}

// scanClaimed reads a claim's rows (messageColumns, attempt_count, the
// previous claimed_by) into b's lanes, in the order returned, and counts the
// events taken over from an expired lease. It closes rows.
func scanClaimed(rows pgx.Rows, b *batch) (takenOver int64, err error) {
	defer rows.Close()
	var l laneBuilder
	for rows.Next() {
		var row messageRow
		var attempts int
		var prevOwner *string
		if err := rows.Scan(row.dest(&attempts, &prevOwner)...); err != nil {
			return l.takenOver, fmt.Errorf("claim batch: %w", err)
		}
		l.add(b, row, attempts, prevOwner)
	}
	if err := rows.Err(); err != nil {
		return l.takenOver, fmt.Errorf("claim batch: %w", err)
	}
	return l.takenOver, nil
}

// laneBuilder groups claimed rows into a batch's lanes.
type laneBuilder struct {
	laneOf    map[[2]string]int
	takenOver int64
}

// add decodes a claimed row into b, in its aggregate's lane.
func (l *laneBuilder) add(b *batch, row messageRow, attempts int, prevOwner *string) {
	if l.laneOf == nil {
		l.laneOf = map[[2]string]int{}
	}
	var ev claimedEvent
	ev.attempts = attempts
	ev.Message, ev.undecodable = row.decode()
	ev.Attempt = ev.attempts + 1
	if prevOwner != nil {
		l.takenOver++
	}
	key := [2]string{ev.AggregateType, ev.AggregateID}
	i, ok := l.laneOf[key]
	if !ok {
		i = len(b.lanes)
		l.laneOf[key] = i
		b.lanes = append(b.lanes, nil)
	}
	b.lanes[i] = append(b.lanes[i], ev)
	b.total++
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
