package outbox

// The claim's lane lookups on a partitioned outbox (outboxmigrate.Partition).
// A lookup by lane key (aggregate_type, aggregate_id, aggregate_sequence)
// does not name the partition key (event_id), so PostgreSQL probes the lane
// index of every partition for it: a claim's cost grew with the number of
// partitions (the partitions kept for the replay horizon, and the ones made
// ahead), though the events it looks for are almost always in the newest
// one or two. The argument: docs/design.md, "A partitioned outbox", "The
// claim's lookups".

import (
	"context"
	"strconv"
	"strings"

	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// The ids a near lookup reads, around the id of the event it starts from:
// from a minute before it to a second after it. A lane's events are
// written one after another, each under the lane's counter row lock, and
// their ids are made just before (UUIDv7s of the writer's clock), so an
// event's predecessor almost always has an id a little below its own, and
// its successors ids above it; not always (a writer that waited for the
// lock behind another writer of the lane made its id first; an id the
// caller chose), which is why the near lookups are either checked by a
// full one (isHeadNear) or may only find less (successors).
const (
	nearBeforeMs = 60_000
	nearAfterMs  = 1_000
)

// idShiftSQL is the SQL of the lowest UUIDv7 of the millisecond ms after
// (before, when negative) the millisecond the id expression holds, clamped
// at the nil uuid. Compared with event_id it lets PostgreSQL prune the
// partitions outside the range, at execution time, for each row.
func idShiftSQL(id string, ms int) string {
	return `(lpad(to_hex(greatest(('x' || translate(left(` + id + `::text, 13), '-', ''))::bit(48)::bigint + (` +
		strconv.Itoa(ms) + `), 0)), 12, '0') || '00000000000000000000')::uuid`
}

// isHeadNearExcept is isHeadExcept for a partitioned outbox: the same
// answer, found first among the partitions of the ids near e's (a minute
// before it to a second after it), and among all the partitions only when
// the predecessor is not there. The near lookup is exact when it finds the
// predecessor (its key is the lane's: one row); when it finds none, the
// full lookup, as isHeadExcept makes it, decides. A lane's first event is a
// head without a lookup.
func isHeadNearExcept(events, e, except string) string {
	cond := ""
	if except != "" {
		cond = ` AND NOT (` + except + `)`
	}
	probe := func(bound, published string) string {
		return `EXISTS (
		SELECT 1 FROM (
			SELECT p.event_id, p.published_at FROM ` + events + ` p
			WHERE p.aggregate_type = ` + e + `.aggregate_type
			  AND p.aggregate_id = ` + e + `.aggregate_id
			  AND p.aggregate_sequence = ` + e + `.aggregate_sequence - 1` + bound + `
			OFFSET 0) p
		WHERE ` + published + `
		OFFSET 0)`
	}
	near := `
			  AND p.event_id >= ` + idShiftSQL(e+".event_id", -nearBeforeMs) + `
			  AND p.event_id < ` + idShiftSQL(e+".event_id", nearAfterMs)
	// Not an unpublished predecessor near, and either a published one
	// near (no other row has its key) or no unpublished one anywhere. A
	// lane's first event (sequence 1: sequences are positive) has no
	// predecessor to look for. Written with EXISTS, each lookup stops at
	// its first row; as one aggregate over each lookup (bool_or), the same
	// check took ten times as long for fewer buffers.
	return `(` + e + `.aggregate_sequence = 1 OR (NOT ` + probe(near, `p.published_at IS NULL`+cond) + `
		AND (` + probe(near, `NOT (p.published_at IS NULL`+cond+`)`) + `
			OR NOT ` + probe("", `p.published_at IS NULL`+cond) + `)))`
}

// skippedFromNear is skippedFromSQL for a partitioned outbox: the
// predecessor of a claimed head is read near e's id first (one row: its
// skipped_from when it was skipped, else 0), and only when it is not near
// through skippedFromSQL's probe of every partition. A lane's first event
// has no predecessor.
func skippedFromNear(events, e string) string {
	return `(CASE WHEN ` + e + `.aggregate_sequence = 1 THEN 0 ELSE coalesce((
		SELECT CASE WHEN s.skipped_at IS NOT NULL THEN coalesce(s.skipped_from, 0) ELSE 0 END FROM (
			SELECT s.skipped_at, s.skipped_from FROM ` + events + ` s
			WHERE s.aggregate_type = ` + e + `.aggregate_type AND s.aggregate_id = ` + e + `.aggregate_id
			  AND s.aggregate_sequence = ` + e + `.aggregate_sequence - 1
			  AND s.event_id >= ` + idShiftSQL(e+".event_id", -nearBeforeMs) + `
			  AND s.event_id < ` + idShiftSQL(e+".event_id", nearAfterMs) + `
			OFFSET 0) s LIMIT 1),
		` + skippedFromSQL(events, e) + `) END)`
}

// successorsKey is the line of successorsSQL that states the successors'
// range of sequences; successorsNear adds to it the bound of their ids.
const successorsKey = `
		  AND s.aggregate_sequence > h.aggregate_sequence
`

// successorsNear bounds the successors' lookup of a partitioned outbox by
// their ids: at or after a minute before the head's. A successor whose id
// is older (its writer made it long before it wrote it, or the caller chose
// it) is not found: the head's run stops before it, as at any missing
// sequence, and it is claimed later as the head of its lane.
var successorsNear = `
		  AND s.aggregate_sequence > h.aggregate_sequence
		  AND s.event_id >= ` + idShiftSQL("h.event_id", -nearBeforeMs) + `
`

// partitionedSQL returns the statements of sq with their lane lookups made
// for a partitioned outbox of table events: the heads' checks of isHead
// and isHeadExcept become isHeadNearExcept, the claimed heads' skip probe
// skippedFromNear, and the successors' lookup is bounded by
// successorsNear. The statements are otherwise the same text,
// so that a plain table's plans stay as they are.
func partitionedSQL(sq relaySQL, events string) relaySQL {
	swap := func(sql string) string {
		for _, e := range []string{"e", "f", "h"} {
			for _, except := range []string{"", claimIDsExcept} {
				sql = strings.ReplaceAll(sql, isHeadExcept(events, e, except), isHeadNearExcept(events, e, except))
			}
		}
		sql = strings.ReplaceAll(sql, skippedFromSQL(events, "e"), skippedFromNear(events, "e"))
		return strings.ReplaceAll(sql, successorsKey, successorsNear)
	}
	for _, p := range []*string{&sq.claim, &sq.fastClaim, &sq.look, &sq.claimLooked, &sq.claimIDs, &sq.handOffWindow} {
		*p = swap(*p)
	}
	return sq
}

// partitionAware makes r's statements partitionedSQL's when outbox_events
// is a partitioned table, once, before r's first claim (Run, PublishIDs,
// the Explain methods). A table converted while the relay runs keeps the
// plain statements until the relay restarts: they are right on it, only
// slower. An error reading the catalogue leaves them plain too.
func (r *Relay) partitionAware(ctx context.Context) {
	r.partitionOnce.Do(func() {
		parted, err := partman.IsPartitioned(ctx, pgtx.Pool(r.pool), r.schema)
		if err != nil || !parted {
			return
		}
		r.sql = partitionedSQL(r.sql, r.schema.Table("outbox_events"))
		r.partitioned = true
	})
}
