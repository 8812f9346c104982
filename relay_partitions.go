package outbox

// The upkeep of a partitioned outbox (outboxmigrate.Partition): partitions
// created ahead of the ids to come, and the partitions whose events are
// all settled and past the replay horizon detached and dropped, instead of
// the clean-up's DELETE (docs/operations.md, "Partitioned outbox").

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// partitionUpkeepEvery is the longest pause between two rounds of a
// relay's partition upkeep; a partition narrower than four times that is
// looked after every quarter of its width.
const partitionUpkeepEvery = time.Minute

// errUpkeepBusy: another process of the schema is running the upkeep now.
var errUpkeepBusy = errors.New("another process is running the partition upkeep")

// upkeepPartitions runs one round of partman.Upkeep on a connection of
// pool (upkeepSession).
func upkeepPartitions(ctx context.Context, pool *pgxpool.Pool, s pgident.Schema, horizon time.Duration, ahead int) (partman.Result, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return partman.Result{}, err
	}
	defer conn.Release()
	return upkeepSession(ctx, pgtx.Conn(conn), func() { conn.Conn().Close(context.WithoutCancel(ctx)) }, s, horizon, ahead)
}

// upkeepSession runs one round of partman.Upkeep on sess, one session,
// holding a session advisory lock of the schema's upkeep, so that relays
// (and `outbox cleanup`) of one schema take turns rather than creating or
// detaching the same partition at once: errUpkeepBusy when another holds
// it. discard closes the session when the lock cannot be released (a
// session lock must not go back to a pool).
func upkeepSession(ctx context.Context, sess pgtx.DB, discard func(), s pgident.Schema, horizon time.Duration, ahead int) (partman.Result, error) {
	h := fnv.New64a()
	h.Write([]byte("outbox partition upkeep " + s.Name()))
	lock := int64(h.Sum64())
	var got bool
	if err := sess.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lock).Scan(&got); err != nil {
		return partman.Result{}, err
	}
	if !got {
		return partman.Result{}, errUpkeepBusy
	}
	defer func() {
		if _, err := sess.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lock); err != nil {
			discard()
		}
	}()
	return partman.Upkeep(ctx, sess, s, horizon, ahead)
}

// partitionLoop runs the partition upkeep at start and then every
// partitionUpkeepEvery (or a quarter of the partitions' width, when
// shorter) while outbox_events is partitioned, until ctx ends. It checks
// each round, so a conversion needs no restart; on a plain table the
// rounds are stretched while the relay is idle (see below).
func (r *Relay) partitionLoop(ctx context.Context) {
	db := pgtx.Pool(r.pool)
	cannot := false
	var lastHeld string
	for {
		every := partitionUpkeepEvery
		if r.testPartitionEvery > 0 {
			every = r.testPartitionEvery
		}
		parted, err := partman.IsPartitioned(ctx, db, r.schema)
		if err == nil && parted {
			var res partman.Result
			res, err = upkeepPartitions(ctx, r.pool, r.schema, r.cfg.Cleanup.OlderThan, r.cfg.PartitionsAhead)
			if parts, lerr := partman.List(ctx, db, r.schema); lerr == nil {
				if w := partman.Interval(parts) / 4; w > 0 && w < every {
					every = max(w, time.Second)
				}
			}
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, partman.ErrNotOwner):
				if !cannot {
					r.log.Warn(PartitionUpkeepSkippedNote, slog.String("schema", r.schema.Name()))
					cannot = true
				}
			case errors.Is(err, errUpkeepBusy):
			case err != nil:
				r.log.Warn("partition upkeep failed", slog.Any("error", err))
			default:
				cannot = false
			}
			if len(res.Created) > 0 || len(res.Dropped) > 0 || len(res.Attached) > 0 || len(res.Pending) > 0 {
				r.log.Info("partition upkeep", slog.Any("created", res.Created), slog.Any("dropped", res.Dropped),
					slog.Any("attached_again", res.Attached), slog.Any("detach_pending", res.Pending))
			}
			if held := heldSummary(res.Held); held != lastHeld {
				if held != "" {
					r.log.Info("partitions past the replay horizon kept", slog.String("held", held))
				}
				lastHeld = held
			}
		} else if err != nil && ctx.Err() == nil {
			r.log.Warn("partition upkeep: cannot read outbox_events", slog.Any("error", err))
		}
		if err == nil && !parted {
			// The check for a conversion is upkeep like the heartbeat: it is
			// stretched while the relay is idle, up to IdleBackoffMax, and cut back
			// to every when a claim finds an event. A table converted while the
			// relay idles takes writes meanwhile in the partitions the conversion
			// made ahead only: they must outlast the longer of IdleBackoffMax and
			// every (docs/operations.md, "Partitioned outbox"; a hostile review
			// showed that outbox cleanup, which makes 6 ahead once, does not make up
			// for them). A fleet's 200 idle sources each read the catalogue once a
			// minute without it: 3.3 of the 4.6 transactions a second
			// TestFleetFigureIdle counted. A partitioned table's rounds are not
			// stretched: its partitions are made ahead by the clock, idle or not.
			wait, ended := r.upkeepWait(every)
			upkeepSleep(ctx, wait, every, ended, nil)
		} else {
			sleep(ctx, every)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

func heldSummary(held []partman.Held) string {
	var b strings.Builder
	for i, h := range held {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(h.Name + ": " + h.Why)
	}
	return b.String()
}
