package partman

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Hold is what keeps a partition: its events that are not settled, or
// that a later event still needs.
type Hold struct {
	// Unpublished is how many of its events are neither published nor
	// skipped (quarantined ones included), counted up to holdCountCap.
	Unpublished int64
	// Quarantined is how many of those are quarantined.
	Quarantined int64
	// LastPublished is the latest published_at (publish or skip) among its
	// events; zero when none is settled.
	LastPublished time.Time
	// SkipMarkers is how many skipped events it holds whose aggregate's
	// next event was not written yet or lives in another partition: that
	// event's claim, and any replay of it, reads the skipped event's
	// skipped_from (Message.SkippedFrom), as clean-up's DELETE keeps them.
	SkipMarkers int64
}

// holdCountCap bounds the counts of a Hold: a status that counts a
// partition's whole backlog would read all of it.
const holdCountCap = 100000

// Settled reports whether every event is settled and none is needed by a
// later one: the partition can go once LastPublished is past the horizon.
func (h Hold) Settled() bool { return h.Unpublished == 0 && h.SkipMarkers == 0 }

// Reason says why the partition stays, given the replay horizon as the
// time before which everything may go; "" when it may go.
func (h Hold) Reason(horizon time.Time) string {
	var why []string
	if h.Unpublished > 0 {
		n := fmt.Sprint(h.Unpublished)
		if h.Unpublished >= holdCountCap {
			n = fmt.Sprintf("at least %d", holdCountCap)
		}
		s := n + " unpublished event(s)"
		if h.Quarantined > 0 {
			s += fmt.Sprintf(", %d of them quarantined", h.Quarantined)
		}
		why = append(why, s)
	}
	if h.SkipMarkers > 0 {
		why = append(why, fmt.Sprintf("%d skipped event(s) whose next event is still to come or in a later partition", h.SkipMarkers))
	}
	if !h.LastPublished.IsZero() && !h.LastPublished.Before(horizon) {
		why = append(why, "events published within the replay horizon (the last at "+h.LastPublished.UTC().Format(time.RFC3339)+")")
	}
	return strings.Join(why, "; ")
}

// Check reads what holds partition p. It reads through the parent table,
// by p's range of event ids (which prunes to p), so that a role with
// SELECT on outbox_events and no right on the partitions (the operator's)
// can run it.
func Check(ctx context.Context, q pgtx.Querier, s pgident.Schema, p Partition) (Hold, error) {
	return check(ctx, q, s.Table("outbox_events"), p, s)
}

func check(ctx context.Context, q pgtx.Querier, table string, p Partition, s pgident.Schema) (Hold, error) {
	events := s.Table("outbox_events")
	aggs := s.Table("outbox_aggregates")
	in := `event_id >= $1 AND event_id < $2`
	var h Hold
	var last *time.Time
	err := q.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM (SELECT 1 FROM `+table+` WHERE `+in+` AND published_at IS NULL LIMIT `+fmt.Sprint(holdCountCap)+`) u),
	(SELECT count(*) FROM `+table+` WHERE `+in+` AND num_nonnulls(quarantined_at) > num_nonnulls(published_at)),
	(SELECT max(published_at) FROM `+table+` WHERE `+in+` AND published_at IS NOT NULL),
	(SELECT count(*) FROM `+table+` e WHERE e.event_id >= $1 AND e.event_id < $2 AND e.skipped_at IS NOT NULL
	   AND NOT (coalesce((SELECT a.last_sequence FROM `+aggs+` a
	                      WHERE a.aggregate_type = e.aggregate_type AND a.aggregate_id = e.aggregate_id), 0) > e.aggregate_sequence
	            AND NOT EXISTS (SELECT 1 FROM `+events+` n
	                WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id
	                  AND n.aggregate_sequence = e.aggregate_sequence + 1
	                  AND NOT (n.event_id >= $1 AND n.event_id < $2))))`,
		p.FromID, p.ToID).Scan(&h.Unpublished, &h.Quarantined, &last, &h.SkipMarkers)
	if err != nil {
		return h, fmt.Errorf("check partition %s: %w", p.Name, err)
	}
	if last != nil {
		h.LastPublished = *last
	}
	return h, nil
}

// Held is a partition past the horizon that stays, and why.
type Held struct {
	Partition
	Hold
	Why string
}

// Result is what one round of upkeep did.
type Result struct {
	// Created are the partitions created ahead.
	Created []string
	// Dropped are the partitions detached and dropped.
	Dropped []string
	// Held are the partitions past the horizon that stay.
	Held []Held
}

// DropSettled turns on Upkeep's detach and drop of settled partitions: off
// by default until the defects in Upkeep's comment are fixed; the tests of
// the drop turn it on.
var DropSettled atomic.Bool

// Upkeep creates the partitions due ahead (EnsureAhead) and, when horizon
// is positive, detaches and drops every partition whose ids and publishes
// are all older than horizon and whose events are all settled (Check). It
// needs the table's owner (CanManage): ErrNotOwner otherwise. DETACH
// PARTITION ... CONCURRENTLY cannot run in a transaction, so db must run
// Exec outside one (a pool or a database).
//
// The detach and drop run only while DropSettled is on; it is off in this
// release (docs/operations.md, "Partitioned outbox"): a hostile review
// found two ways for them to strand a committed event out of the relay's
// reach (a detached table whose second step failed; a detach left pending
// that no relay without a horizon finishes) and one to stall the upkeep
// behind a long reader until writes are refused.
func Upkeep(ctx context.Context, db pgtx.DB, s pgident.Schema, horizon time.Duration, ahead int) (Result, error) {
	var res Result
	ok, err := CanManage(ctx, db, s)
	if err != nil {
		return res, err
	}
	if !ok {
		return res, ErrNotOwner
	}
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return res, err
	}
	if res.Created, err = EnsureAhead(ctx, db, s, now, ahead); err != nil {
		return res, err
	}
	if horizon <= 0 || !DropSettled.Load() {
		return res, nil
	}
	parts, err := List(ctx, db, s)
	if err != nil {
		return res, err
	}
	cut := now.Add(-horizon)
	for i, p := range parts {
		if i == len(parts)-1 {
			break // the newest stays: it gives the next ones their width
		}
		if !p.DetachPending && p.To.After(cut) {
			continue
		}
		gone, held, err := dropOne(ctx, db, s, p, cut)
		if err != nil {
			return res, err
		}
		if gone {
			res.Dropped = append(res.Dropped, p.Name)
		} else if held != nil {
			res.Held = append(res.Held, *held)
		}
	}
	return res, nil
}

// dropOne drops partition p when nothing holds it. A detach interrupted
// earlier (p.DetachPending) is finished with FINALIZE first. After the
// detach, the table is checked again under an ACCESS EXCLUSIVE lock, as a
// table of its own that no writer can reach any more: an event written
// between the first check and the detach (an id of the caller's, from the
// past) puts the table back (ATTACH, which the CHECK constraint the detach
// left proves without a scan) instead of dropping it.
func dropOne(ctx context.Context, db pgtx.DB, s pgident.Schema, p Partition, cut time.Time) (bool, *Held, error) {
	parent := s.Table("outbox_events")
	t := s.Table(p.Name)
	if !p.DetachPending {
		h, err := Check(ctx, db, s, p)
		if err != nil {
			return false, nil, err
		}
		if why := h.Reason(cut); why != "" {
			return false, &Held{Partition: p, Hold: h, Why: why}, nil
		}
		if _, err := db.Exec(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+t+` CONCURRENTLY`); err != nil {
			return false, nil, fmt.Errorf("detach partition %s: %w", p.Name, err)
		}
	} else if _, err := db.Exec(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+t+` FINALIZE`); err != nil {
		return false, nil, fmt.Errorf("finish the interrupted detach of partition %s: %w", p.Name, err)
	}
	var held *Held
	err := db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+lockTimeout+`'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE `+t+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		h, err := check(ctx, tx, t, p, s)
		if err != nil {
			return err
		}
		if why := h.Reason(cut); why != "" {
			held = &Held{Partition: p, Hold: h, Why: why}
			_, err := tx.Exec(ctx, `ALTER TABLE `+parent+` ATTACH PARTITION `+t+` FOR VALUES FROM ('`+p.FromID.String()+`') TO ('`+p.ToID.String()+`')`)
			return err
		}
		_, err = tx.Exec(ctx, `DROP TABLE `+t)
		return err
	})
	if err != nil {
		return false, nil, fmt.Errorf("drop partition %s: %w", p.Name, err)
	}
	return held == nil, held, nil
}
