package outbox

// Settling: after a batch is published, what the broker acknowledged is
// marked published, failures are recorded (with their backoff or quarantine)
// and what was not attempted is released, each fenced by the batch token.
// The argument: docs/design.md, "Publishing and fencing".

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/pgretry"
)

// settleAll writes a batch's outcome when some of it failed or was not
// attempted: marks, failures and releases go in one transaction (one round
// trip, a pipelined batch). With a head and its successors in one batch, a
// lane's published events, its failed event and the events claimed behind
// that one are settled together, so no reader (another relay, an operator's
// status) sees the failure, or a quarantine, while the events behind it are
// still leased, nor some of the batch settled and the rest not.
func (r *Relay) settleAll(ctx context.Context, b batch, published []uuid.UUID, fs []failure, unsent []uuid.UUID) error {
	type op struct {
		kind SettleOp
		name string
		n    int
		tag  pgconn.CommandTag
	}
	var ops []*op
	var flagged, lanes int64
	// A batch runs as one implicit transaction: all or nothing. queue
	// builds it (again for each attempt: a pgx.Batch is not reusable once
	// sent) and lists its statements once.
	queue := func(q *pgx.Batch, list bool) {
		if len(published) > 0 {
			q.Queue(r.sql.markPublished, uuidArgs(published), b.token)
			if list {
				ops = append(ops, &op{kind: SettleMarkPublished, name: "mark published", n: len(published)})
			}
		}
		if len(fs) > 0 {
			q.Queue(r.sql.markFailed, failureArgs(fs, b.token)...)
			if list {
				ops = append(ops, &op{kind: SettleRecordFailures, name: "record failures", n: len(fs)})
			}
		}
		if len(unsent) > 0 {
			q.Queue(r.sql.release, uuidArgs(unsent), b.token)
			if list {
				ops = append(ops, &op{kind: SettleRelease, name: "release", n: len(unsent)})
			}
		}
		// Quarantined events park their lanes in the same transaction, so the
		// events waiting behind leave the claim's range as their head becomes
		// unclaimable (see parked.go). Two statements: the first flags the
		// lanes whose counter rows are free (SKIP LOCKED: a writer's open
		// transaction never holds the settle), the second one's snapshot is
		// taken once those rows are held, so it sees every event written to
		// them. Busy lanes are left to the lane sweep.
		if ids := quarantinedIDs(fs); len(ids) > 0 {
			q.Queue(r.sql.flagLanes, ids)
			q.Queue(r.sql.parkLanes, ids)
			if list {
				ops = append(ops, &op{kind: settleParkLanes, name: "flag lanes"}, &op{kind: settleParkLanes, name: "park lanes"})
			}
		}
	}
	queue(new(pgx.Batch), true)
	start := time.Now()
	retried := false
	err := pgretry.Do(ctx, b.leaseEnd, func(ctx context.Context, a pgretry.Attempt) error {
		retried = a.Retried()
		var q pgx.Batch
		queue(&q, false)
		res := r.planned(r.pool).SendBatch(ctx, &q)
		var err error
		for _, o := range ops {
			if o.name == "flag lanes" {
				err = res.QueryRow().Scan(&flagged, &lanes)
			} else {
				o.tag, err = res.Exec()
			}
			if err != nil {
				break
			}
		}
		if cerr := res.Close(); err == nil {
			err = cerr
		}
		return err
	})
	for _, o := range ops {
		if o.kind != settleParkLanes {
			r.observeSettle(o.kind, o.n, o.tag.RowsAffected(), start, err)
		}
	}
	if err != nil {
		return fmt.Errorf("settle batch: %w", err)
	}
	if retried {
		r.log.Info("settle written again after a lost connection", slog.Int("events", b.total))
	}
	if busy := lanes - flagged; busy > 0 {
		r.log.Info("lane not parked yet: a transaction holds its counter row; the lane sweep parks it",
			slog.Int64("lanes", busy))
		r.sweepSoon()
	}
	for _, o := range ops {
		if o.kind == settleParkLanes {
			if o.name == "park lanes" && o.tag.RowsAffected() > 0 {
				r.log.Info("lane parked behind its quarantined event", slog.Int64("events_parked", o.tag.RowsAffected()),
					slog.Duration("settle_took", time.Since(start)))
				if o.tag.RowsAffected() >= laneParkBatch {
					r.sweepSoon() // the lane may be longer: the sweep parks the rest
				}
			}
			continue
		}
		if retried {
			// The first attempt may have committed unseen: the rows it
			// settled are no longer under the token, so the retry finds
			// fewer. Within the lease nobody else can hold them: count the
			// batch as settled, not as lease conflicts.
			if o.kind == SettleMarkPublished {
				r.published.Add(int64(o.n))
			}
			continue
		}
		if o.kind == SettleMarkPublished {
			r.published.Add(o.tag.RowsAffected())
		}
		r.noteConflicts(o.name, o.n, o.tag.RowsAffected())
	}
	return nil
}

// settleParkLanes marks the parking statements of a settle, which are not
// reported to the SettleObserver (their rows are lanes' waiting events, not
// the batch's).
const settleParkLanes SettleOp = "park_lanes"

// quarantinedIDs are the ids of the failures that quarantine their event.
func quarantinedIDs(fs []failure) [][16]byte {
	var ids [][16]byte
	for _, f := range fs {
		if f.quarantine {
			ids = append(ids, f.id)
		}
	}
	return ids
}

// markPublished marks the acknowledged events ids of b, fenced by b's
// token. A lost connection does not lose the mark: it is written again on
// another connection until b's lease ends (see settled).
func (r *Relay) markPublished(ctx context.Context, b batch, ids []uuid.UUID) error {
	n, err := r.settled(ctx, b, SettleMarkPublished, r.sql.markPublished, ids)
	if err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	r.published.Add(n)
	return nil
}

func (r *Relay) release(ctx context.Context, b batch, ids []uuid.UUID) error {
	if _, err := r.settled(ctx, b, SettleRelease, r.sql.release, ids); err != nil {
		return fmt.Errorf("release claims: %w", err)
	}
	return nil
}

// settled runs a fenced write-back of b's events ids (statement stmt, with
// the ids and b's token) and returns how many it settled. When the
// connection is lost (a failover, a pooler restart, pg_terminate_backend)
// it writes again on another connection, until b's lease ends: the
// acknowledged events of a relay whose connection died are neither left to
// wait for their lease to expire nor published again once it has. The
// write is fenced, so a retry after a first attempt that committed unseen
// changes nothing; its missing rows are then this relay's own, not lease
// conflicts (nobody else can hold them before the lease ends).
func (r *Relay) settled(ctx context.Context, b batch, op SettleOp, stmt string, ids []uuid.UUID) (int64, error) {
	start := time.Now()
	var tag pgconn.CommandTag
	retried := false
	err := pgretry.Do(ctx, b.leaseEnd, func(ctx context.Context, a pgretry.Attempt) error {
		retried = a.Retried()
		var err error
		tag, err = r.planned(r.pool).Exec(ctx, stmt, uuidArgs(ids), b.token)
		return err
	})
	r.observeSettle(op, len(ids), tag.RowsAffected(), start, err)
	if err != nil {
		return 0, err
	}
	if retried {
		r.log.Info("settle written again after a lost connection", slog.String("op", string(op)), slog.Int("events", len(ids)))
		return int64(len(ids)), nil
	}
	r.noteConflicts(string(op), len(ids), tag.RowsAffected())
	return tag.RowsAffected(), nil
}

func (r *Relay) noteConflicts(op string, want int, got int64) {
	if lost := int64(want) - got; lost > 0 {
		r.conflicts.Add(lost)
		r.log.Warn("lease lost: another relay took these events over", slog.String("op", op), slog.Int64("events", lost))
	}
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

// failureArgs are the arguments of the record-failures statement: one array
// per column, in the order of fs, then the fencing token.
func failureArgs(fs []failure, token uuid.UUID) []any {
	ids := make([]uuid.UUID, len(fs))
	delays := make([]int64, len(fs))
	attempts := make([]int32, len(fs))
	msgs := make([]string, len(fs))
	quarantine := make([]bool, len(fs))
	for i, f := range fs {
		ids[i], delays[i], attempts[i], msgs[i], quarantine[i] = f.id, f.delay.Milliseconds(), int32(f.attempts), f.err, f.quarantine
	}
	return []any{uuidArgs(ids), delays, attempts, msgs, quarantine, token}
}
