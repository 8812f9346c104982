package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// CleanupBatchSizeDefault is the default number of rows one clean-up
// transaction deletes.
const CleanupBatchSizeDefault = 1000

// ErrInboxHorizon is wrapped by the error refusing a clean-up whose inbox
// horizon is shorter than its replay horizon.
var ErrInboxHorizon = errors.New("inbox horizon shorter than the replay horizon")

// CleanupConfig says what a clean-up deletes. Used by Admin.Cleanup and by
// the relay's periodic clean-up (RelayConfig.Cleanup).
type CleanupConfig struct {
	// OlderThan is the retention, also the replay horizon: settled events
	// (published or skipped) whose published_at is further back than this
	// are deleted. Unpublished events, quarantined ones included, are never
	// deleted, however old; a skipped event is kept until the next event of
	// its aggregate was written and cleaned up (a replay of that event needs the
	// skip marker). Required, positive.
	OlderThan time.Duration
	// InboxOlderThan, when positive, also deletes the inbox's
	// processed_events rows processed further back than this. It must not be
	// shorter than OlderThan: an event that can still be replayed must still
	// be known to the inboxes (ErrInboxHorizon). The per-aggregate
	// high-water marks (inbox_aggregates) are never deleted, so an
	// aggregate's old events keep being recognised as duplicates. Zero
	// leaves inbox rows alone.
	InboxOlderThan time.Duration
	// BatchSize is the most rows deleted per transaction. Defaults to
	// CleanupBatchSizeDefault.
	BatchSize int
	// Progress, when set, is called after each committed batch.
	Progress func(CleanupProgress)
}

// CleanupProgress reports one committed clean-up batch.
type CleanupProgress struct {
	// Table is "outbox_events" or "processed_events".
	Table string
	// Deleted is how many rows the batch deleted.
	Deleted int
	// Total is how many rows of Table this clean-up deleted so far.
	Total int64
}

// CleanupResult is what a clean-up deleted.
type CleanupResult struct {
	// Events is how many settled events were deleted.
	Events int64
	// InboxRows is how many processed_events rows were deleted.
	InboxRows int64
	// Batches is how many transactions committed.
	Batches int
	// Duration is how long the clean-up took.
	Duration time.Duration
	// PartitionsDropped are the partitions detached and dropped, on a
	// partitioned outbox_events, where clean-up deletes no event (Events
	// is 0): it drops each partition whose events are all settled and
	// published longer ago than OlderThan (docs/operations.md,
	// "Partitioned outbox").
	PartitionsDropped []string
	// PartitionsHeld are the partitions past the horizon that stay, each
	// with why (PartitionStatus.Held).
	PartitionsHeld []PartitionStatus
	// PartitionsCreated are the partitions the clean-up created ahead.
	PartitionsCreated []string
	// PartitionUpkeepSkipped is true on a partitioned outbox when the
	// role does not own outbox_events (the operator role of `outbox
	// migrate --print-grants`): the partition upkeep, which needs the
	// owner, was skipped (PartitionUpkeepSkippedNote) and the inbox
	// clean-up ran.
	PartitionUpkeepSkipped bool
}

// PartitionUpkeepSkippedNote is what the relay logs (once) and `outbox
// cleanup` prints when the partition upkeep is skipped because the role
// does not own outbox_events.
const PartitionUpkeepSkippedNote = "outbox_events is partitioned and this role does not own it, so it cannot create partitions ahead or drop settled ones: " +
	"run `outbox cleanup` as the tables' owner regularly, or the relay as that owner (docs/operations.md, Partitioned outbox)"

func (c CleanupConfig) validate() error {
	switch {
	case c.OlderThan < 0:
		return fmt.Errorf("outbox: clean-up horizon %s is negative", c.OlderThan)
	case c.OlderThan == 0:
		return errors.New("outbox: clean-up needs a positive horizon (OlderThan, the replay horizon)")
	case c.InboxOlderThan < 0:
		return fmt.Errorf("outbox: inbox clean-up horizon %s is negative", c.InboxOlderThan)
	case c.InboxOlderThan > 0 && c.InboxOlderThan < c.OlderThan:
		return fmt.Errorf("outbox: %w: inbox rows would be deleted after %s while events can be replayed for %s; keep inbox rows at least as long",
			ErrInboxHorizon, c.InboxOlderThan, c.OlderThan)
	case c.BatchSize < 0:
		return fmt.Errorf("outbox: clean-up batch size %d is negative", c.BatchSize)
	}
	return nil
}

// cleaner deletes rows past their horizon in bounded batches.
type cleaner struct {
	db     pgtx.DB
	schema pgident.Schema
	// upkeep runs the partition upkeep on a partitioned outbox_events;
	// nil for the relay's clean-up, whose partition loop does it
	// (relay_partitions.go).
	upkeep       func(ctx context.Context, horizon time.Duration) (partman.Result, error)
	obs          CleanupObserver
	deleteEvents string
	deleteInbox  string
}

func newCleaner(db pgtx.DB, s pgident.Schema, obs CleanupObserver) *cleaner {
	processed := s.Table("processed_events")
	return &cleaner{
		db:     db,
		schema: s,
		obs:    obs,
		// Settled rows only: published_at < horizon excludes every unpublished
		// (and so every quarantined) row. The batch walks
		// outbox_published_at_idx from the oldest and locks its rows (SKIP
		// LOCKED lets several cleaners share the work); the DELETE then finds
		// them by ctid, a TID scan, where "event_id IN (...)" may be planned
		// as a hash join over the whole table. A skipped event stays as long
		// as the next event of its aggregate is in the table, and until that
		// one was written: the next event's claim, and any replay of it, read
		// the skipped event's skipped_from (Message.SkippedFrom), without
		// which an inbox would wait for the skipped events forever. So it goes
		// only once the counter row shows a later sequence was handed out and
		// that event is gone (cleaned up after it, in a later batch). The
		// probes are scalar subqueries (index lookups, never hashed over the
		// table) evaluated for skipped rows only.
		//
		// That statement is the function cleanup_events (migration 011), so
		// that the relay and operator roles delete events through it only,
		// and never an unpublished one: they have no DELETE on outbox_events.
		deleteEvents: `SELECT ` + s.Quoted() + `.cleanup_events($1 * interval '1 microsecond', $2)`,
		deleteInbox: `WITH gone AS (DELETE FROM ` + processed + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + processed + `
	WHERE processed_at < now() - $1 * interval '1 microsecond'
	ORDER BY processed_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED)) RETURNING 1)
SELECT count(*) FROM gone`,
	}
}

// run deletes settled events, then inbox rows, past their horizons, batch
// by batch until a batch comes back short or ctx ends.
func (c *cleaner) run(ctx context.Context, cfg CleanupConfig) (CleanupResult, error) {
	start := time.Now()
	var res CleanupResult
	if err := cfg.validate(); err != nil {
		return res, err
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = CleanupBatchSizeDefault
	}
	// A partitioned outbox_events loses its settled events with their
	// partition, never by DELETE.
	parted, err := partman.IsPartitioned(ctx, c.db, c.schema)
	switch {
	case err != nil:
	case parted && c.upkeep != nil:
		var r partman.Result
		r, err = c.upkeep(ctx, cfg.OlderThan)
		if errors.Is(err, partman.ErrNotOwner) {
			res.PartitionUpkeepSkipped, err = true, nil
		}
		res.PartitionsDropped, res.PartitionsCreated = r.Dropped, r.Created
		for _, h := range r.Held {
			res.PartitionsHeld = append(res.PartitionsHeld, partitionStatus(h.Partition, h.Hold, h.Why))
		}
		if err != nil {
			err = fmt.Errorf("partition upkeep: %w", err)
		}
	case !parted:
		err = c.table(ctx, cfg, "outbox_events", c.deleteEvents, cfg.OlderThan, &res.Events, &res.Batches)
	}
	if err == nil && cfg.InboxOlderThan > 0 {
		err = c.table(ctx, cfg, "processed_events", c.deleteInbox, cfg.InboxOlderThan, &res.InboxRows, &res.Batches)
	}
	res.Duration = time.Since(start)
	return res, err
}

func (c *cleaner) table(ctx context.Context, cfg CleanupConfig, table, query string, horizon time.Duration, total *int64, batches *int) error {
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("clean up %s: %w", table, err)
		}
		start := time.Now()
		n, err := c.batch(ctx, query, horizon, cfg.BatchSize)
		if err != nil {
			return fmt.Errorf("clean up %s: %w", table, err)
		}
		*total += int64(n)
		*batches++
		if c.obs != nil {
			c.obs.ObserveCleanup(CleanupObservation{Table: table, Deleted: n, Duration: time.Since(start)})
		}
		if cfg.Progress != nil {
			cfg.Progress(CleanupProgress{Table: table, Deleted: n, Total: *total})
		}
		if n < cfg.BatchSize {
			return nil
		}
	}
}

// batch deletes at most n rows in one transaction. The cleanup/mid-batch
// failpoint sits between the DELETE and the COMMIT: a crash there rolls the
// batch back whole.
func (c *cleaner) batch(ctx context.Context, query string, horizon time.Duration, n int) (int, error) {
	var deleted int64
	err := c.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		if err := tx.QueryRow(ctx, query, horizon.Microseconds(), n).Scan(&deleted); err != nil {
			return err
		}
		return failpoint.Hit("cleanup/mid-batch")
	})
	if err != nil {
		return 0, err
	}
	return int(deleted), nil
}
