package outbox

// Parked lanes: the events waiting behind a quarantined event are taken out
// of the relay's claim, so that however many of them there are, a claim does
// not read them.
//
// The claim walks outbox_dispatch_idx (available_at, occurred_at) over the
// due events (available_at <= now()) and keeps the heads of lanes. An event
// behind a quarantined head is due but never a head: before parking, every
// claim read each of them to find that out (1.8 µs per blocked event per
// claim). Parking a lane sets its waiting events' available_at to
// 'infinity', out of the claim's index range, and flags the aggregate's
// counter row (outbox_aggregates.parked_at) so that a writer appending to
// the lane writes its event parked too. Unparking sets available_at back to
// now().
//
// Parking never decides what may be published: a parked event is
// unpublished and not quarantined, so status, metrics, clean-up and the
// ordering rule see it as any waiting event; it is only not due. The claim's
// lane check (an event is claimed only as the head of its lane, or a claimed
// head's contiguous successor) is what keeps I5, and parking only makes
// events not due, or due again, behind a head that cannot be claimed (it is
// quarantined). Getting the parking wrong costs claim time, never order.
//
// Who parks and unparks, each in one transaction with the change that makes
// it true:
//
//   - the relay's settle, when it quarantines an event (record failures);
//   - the writer, for an event written to a parked lane (born parked);
//   - Admin.Retry and Admin.Skip, which unpark the lane they unblock;
//   - the relay's lane sweep (sweepLanes), which repairs lanes left
//     otherwise: lanes a settle left because a writer's transaction held
//     their counter row, events written by writers that do not read
//     parked_at, lanes blocked before migration 006, quarantines or repairs
//     done by hand (a quarantine lifted by hand: the head is made due too,
//     since its claimers' cursors passed it).
//
// Lock order: the writer locks the counter row, then inserts events (it
// locks no existing event). The settle and Admin lock the quarantined
// event, then the counter row, then update the waiting events in a later
// statement, whose snapshot is taken once the counter row is held: no
// writer of the lane is then in flight, so every event of the lane is
// committed and visible, and every later writer reads the new flag. The
// settle and the sweep take the counter row with SKIP LOCKED and leave the
// lane (to the sweep's next run) when it is busy, so neither ever waits for
// a writer's transaction; only an operator's Retry or Skip waits for it,
// holding nothing the relay needs (the quarantined event's row, which no
// claim locks).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	backoffpkg "github.com/pgoutbox/outbox/internal/backoff"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// parkedAvailableAt is the available_at of a parked event: never due.
const parkedAvailableAt = `'infinity'::timestamptz`

// parkSQL is the statements that park the lanes of the events a batch
// quarantined ($1: their ids), in the settle's transaction. The settle must
// never wait for an application's transaction (issue 19, item 1): a writer
// open on the lane (a slow request, a session idle in transaction) holds
// its counter row until it ends, and the relay's batch loop waits for its
// settle. So:
//
//   - flag takes the lanes' counter rows with SKIP LOCKED and flags those it
//     got (parked_at, parked_through); it returns how many it flagged and
//     how many counter rows there are. A lane whose row is busy is left
//     unflagged: its quarantine, the failure record and the batch's marks
//     commit all the same, and the lane sweep, woken by the relay, parks it
//     once the row is free (it finds it: a quarantined head under an
//     unflagged counter row).
//   - park, a later statement whose snapshot is taken once the rows are
//     held (so it sees every event of those lanes: no
//     writer of them is in flight), takes the next laneParkBatch waiting
//     events of the lanes flag flagged (the counter rows this transaction
//     updated: xmin is its own id) out of the claim. A longer lane is
//     flagged all the same (its writers write parked) and the lane sweep,
//     woken by the relay, parks the rest in transactions of its own: the
//     settle stays bounded (parking one event costs about as much as
//     writing it: every index of outbox_events gets a new entry).
//
// Neither waits for a row lock held by anyone but a short statement. A lane
// left unparked costs claim time only: its waiting events are not heads
// while the quarantined event is unpublished, so the claim never takes them
// (docs/design.md, "Parked lanes"). A quarantine fenced off by the batch
// token (a lost lease) parks nothing, unless another relay quarantined the
// event meanwhile: the condition is the event's state, not who set it.
func parkSQL(s pgident.Schema) (flag, park string) {
	events, aggregates := s.Table("outbox_events"), s.Table("outbox_aggregates")
	heads := `heads AS (
	SELECT q.aggregate_type, q.aggregate_id, min(q.aggregate_sequence) AS aggregate_sequence FROM ` + events + ` q
	WHERE q.event_id = ANY($1) AND q.quarantined_at IS NOT NULL AND q.published_at IS NULL
	GROUP BY q.aggregate_type, q.aggregate_id
)`
	limit := strconv.Itoa(laneParkBatch)
	flag = `WITH ` + heads + `, free AS MATERIALIZED (
	SELECT a.aggregate_type, a.aggregate_id FROM ` + aggregates + ` a
	WHERE (a.aggregate_type, a.aggregate_id) IN (SELECT h.aggregate_type, h.aggregate_id FROM heads h)
	FOR UPDATE OF a SKIP LOCKED
), flagged AS (
	UPDATE ` + aggregates + ` a SET parked_at = coalesce(a.parked_at, now()),
		parked_through = least(` + laneLastSQL(events, "a") + `, h.aggregate_sequence + ` + limit + `)
	FROM free f JOIN heads h USING (aggregate_type, aggregate_id)
	WHERE a.aggregate_type = f.aggregate_type AND a.aggregate_id = f.aggregate_id
	RETURNING 1
)
SELECT (SELECT count(*) FROM flagged),
	(SELECT count(*) FROM ` + aggregates + ` a
	 WHERE (a.aggregate_type, a.aggregate_id) IN (SELECT h.aggregate_type, h.aggregate_id FROM heads h))`
	park = `WITH ` + heads + `, lanes AS (
	SELECT h.* FROM heads h JOIN ` + aggregates + ` a USING (aggregate_type, aggregate_id)
	WHERE a.xmin = pg_current_xact_id_if_assigned()::xid
)
UPDATE ` + events + ` e SET available_at = ` + parkedAvailableAt + `
FROM lanes h
WHERE e.published_at IS NULL
  AND e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
  AND e.aggregate_sequence > h.aggregate_sequence
  AND e.aggregate_sequence <= h.aggregate_sequence + ` + limit + `
  AND e.quarantined_at IS NULL
  AND e.available_at <> ` + parkedAvailableAt
	return flag, park
}

// unparkSQL is the statements that unpark one lane ($1, $2: aggregate type
// and id) in a transaction that already holds its quarantined event's row:
// clear the counter row's flag (taking its lock, after the lane's writers
// in flight), then make the waiting events due now.
func unparkSQL(s pgident.Schema) (flag, events string) {
	flag = `UPDATE ` + s.Table("outbox_aggregates") + ` SET parked_at = NULL, parked_through = NULL
WHERE aggregate_type = $1 AND aggregate_id = $2`
	events = `UPDATE ` + s.Table("outbox_events") + ` SET available_at = ` + dueAgainSQL() + `
WHERE published_at IS NULL AND aggregate_type = $1 AND aggregate_id = $2 AND available_at = ` + parkedAvailableAt
	return flag, events
}

// unparkTx unparks the lane of aggregate (typ, id) in tx (see unparkSQL).
func unparkTx(ctx context.Context, tx pgtx.Querier, s pgident.Schema, typ, id string) error {
	flag, events := unparkSQL(s)
	if _, err := tx.Exec(ctx, flag, typ, id); err != nil {
		return fmt.Errorf("unpark lane: %w", err)
	}
	if _, err := tx.Exec(ctx, events, typ, id); err != nil {
		return fmt.Errorf("unpark lane: %w", err)
	}
	return nil
}

// quarantinedOpen is "quarantined and not published" for the events of
// alias a, in the form of outbox_quarantine_key_idx's predicate (migration
// 017): a statement that states it so can be served by that index (or a
// scan of the table), never by an index of pending events, whose walk
// reads every dead entry under a pinned xmin.
func quarantinedOpen(a string) string {
	return "num_nonnulls(" + a + ".quarantined_at) > num_nonnulls(" + a + ".published_at)"
}

// laneLastSQL is the last sequence handed out on the lane of counter row
// alias a: its floor (last_sequence) or the lane's last event, whichever is
// higher (migration 020: a write in READ COMMITTED locks the counter row
// and reads the lane's last event instead of moving the counter; clean-up
// raises the floor before it deletes a lane's last event). The SQL
// function lane_last is the same for other languages.
func laneLastSQL(events, a string) string {
	return `greatest(` + a + `.last_sequence, (SELECT x.aggregate_sequence FROM ` + events + ` x
		WHERE x.aggregate_type = ` + a + `.aggregate_type AND x.aggregate_id = ` + a + `.aggregate_id
		ORDER BY x.aggregate_sequence DESC LIMIT 1))`
}

// laneHeadSQL is the lowest unpublished event of the lane of alias l (its
// aggregate_type and aggregate_id): one probe of outbox_pending_lane_idx.
func laneHeadSQL(events, l string) string {
	return `SELECT h.aggregate_sequence, h.quarantined_at IS NOT NULL AS quarantined FROM ` + events + ` h
		WHERE h.published_at IS NULL AND h.aggregate_type = ` + l + `.aggregate_type AND h.aggregate_id = ` + l + `.aggregate_id
		ORDER BY h.aggregate_sequence LIMIT 1`
}

// sweepFindSQL finds up to 1,000 lanes the sweep must repair: parked lanes
// whose head is not quarantined or whose parking falls short of their last
// sequence (through outbox_aggregates_parked_idx), and lanes not parked
// whose head is quarantined (through outbox_quarantine_key_idx: the
// quarantined events only, quarantinedOpen; OFFSET 0 keeps that scan a
// statement of its own, so that the planner cannot drive the join from
// every lane in outbox_aggregates instead, probing each lane's events).
func sweepFindSQL(events, aggregates string) string {
	return `SELECT a.aggregate_type, a.aggregate_id FROM ` + aggregates + ` a
LEFT JOIN LATERAL (` + laneHeadSQL(events, "a") + `) h ON true
WHERE a.parked_at IS NOT NULL
  AND (h.quarantined IS NOT TRUE OR a.parked_through IS NULL OR a.parked_through < ` + laneLastSQL(events, "a") + `)
UNION
SELECT a.aggregate_type, a.aggregate_id FROM (SELECT q.aggregate_type, q.aggregate_id, q.aggregate_sequence FROM ` + events + ` q
	WHERE ` + quarantinedOpen("q") + ` OFFSET 0) q
JOIN ` + aggregates + ` a ON a.aggregate_type = q.aggregate_type AND a.aggregate_id = q.aggregate_id
WHERE a.parked_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM ` + events + ` p WHERE p.published_at IS NULL
	AND p.aggregate_type = q.aggregate_type AND p.aggregate_id = q.aggregate_id
	AND p.aggregate_sequence < q.aggregate_sequence)
LIMIT 1000`
}

// laneParkBatch is the most events a settle parks (the rest is left to the
// lane sweep); laneSweepBatch the most sequences the sweep parks in one
// transaction.
const (
	laneParkBatch  = 10000
	laneSweepBatch = 10000
)

// laneSweep is what one run of the lane sweep repaired.
type laneSweep struct {
	// Parked counts the events the sweep took out of the claim: written to a
	// parked lane by a writer that does not read the flag, or waiting in a
	// lane blocked before migration 006.
	Parked int64
	// Unparked counts the events made due again in lanes whose head is no
	// longer quarantined (a quarantine lifted by hand), the head among them.
	Unparked int64
	// Lanes counts the lanes the sweep changed; Busy the lanes it left for
	// the next run because a writer or a settle held them.
	Lanes, Busy int
}

// sweepLanes repairs the parking of every lane that needs it: a lane whose
// head is quarantined is parked up to its last sequence, a parked lane whose
// head is not quarantined (or that has no unpublished event) is unparked.
// It finds them through the parked counter rows and the quarantined events,
// both few, and works one lane and at most laneSweepBatch sequences per
// transaction, until nothing is left or only busy lanes are.
func sweepLanes(ctx context.Context, pool *pgxpool.Pool, s pgident.Schema) (laneSweep, error) {
	events, aggregates := s.Table("outbox_events"), s.Table("outbox_aggregates")
	head := func(l string) string { return laneHeadSQL(events, l) }
	find := sweepFindSQL(events, aggregates)
	var res laneSweep
	busy := map[[2]string]bool{}
	for {
		rows, err := pool.Query(ctx, find)
		if err != nil {
			return res, fmt.Errorf("sweep lanes: %w", err)
		}
		lanes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
			var l [2]string
			return l, row.Scan(&l[0], &l[1])
		})
		if err != nil {
			return res, fmt.Errorf("sweep lanes: %w", err)
		}
		progress := false
		for _, l := range lanes {
			if busy[l] {
				continue
			}
			changed, parked, unparked, err := sweepLane(ctx, pool, events, aggregates, head, l[0], l[1])
			switch {
			case errors.Is(err, errLaneBusy):
				busy[l] = true
				res.Busy++
				continue
			case err != nil:
				return res, err
			}
			res.Parked += parked
			res.Unparked += unparked
			if changed {
				res.Lanes++
				progress = true
			}
		}
		if !progress {
			return res, nil
		}
	}
}

var errLaneBusy = errors.New("lane busy")

// sweepLane repairs one lane in one transaction: it takes the counter row
// (SKIP LOCKED: errLaneBusy when a writer, a settle or an operator holds
// it), reads the lane's head, and parks the next laneSweepBatch sequences of
// a blocked lane or unparks a lane that is not blocked.
func sweepLane(ctx context.Context, pool *pgxpool.Pool, events, aggregates string, head func(string) string, typ, id string) (changed bool, parked, unparked int64, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var last int64
		var isParked bool
		var through *int64
		// outbox_events' lock before the counter row's, the order of every
		// party (migration 020's writers too): the partitioned conversion
		// raises the counters under its lock on outbox_events, and a sweep
		// holding a row while waiting for that lock deadlocked it. The
		// parent only: not every partition's.
		if _, err := tx.Exec(ctx, `LOCK TABLE ONLY `+events+` IN ACCESS SHARE MODE`); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `SELECT parked_at IS NOT NULL, parked_through FROM `+aggregates+`
WHERE aggregate_type = $1 AND aggregate_id = $2 FOR UPDATE SKIP LOCKED`, typ, id).Scan(&isParked, &through)
		if errors.Is(err, pgx.ErrNoRows) {
			return errLaneBusy
		}
		if err != nil {
			return err
		}
		// Statements of their own, after the lock: their snapshots see
		// every event of the lane (no writer of it is in flight).
		if err := tx.QueryRow(ctx, `SELECT `+laneLastSQL(events, "a")+` FROM `+aggregates+` a
WHERE a.aggregate_type = $1 AND a.aggregate_id = $2`, typ, id).Scan(&last); err != nil {
			return err
		}
		var headSeq int64
		var quarantined bool
		err = tx.QueryRow(ctx, `SELECT h.aggregate_sequence, h.quarantined FROM (SELECT $1::text AS aggregate_type, $2::text AS aggregate_id) l
CROSS JOIN LATERAL (`+head("l")+`) h`, typ, id).Scan(&headSeq, &quarantined)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if !quarantined {
			if !isParked {
				return nil
			}
			tag, err := tx.Exec(ctx, `UPDATE `+events+` SET available_at = `+dueAgainSQL()+`
WHERE published_at IS NULL AND aggregate_type = $1 AND aggregate_id = $2 AND available_at = `+parkedAvailableAt, typ, id)
			if err != nil {
				return err
			}
			unparked = tag.RowsAffected()
			// The head too, when it is as written: a quarantine set and
			// lifted by hand never rescheduled it, so it went back into
			// outbox_fresh_key_idx behind every relay's cursor, and only the
			// full scan would read it (TestLivenessQuarantineLiftedByHand).
			// Made due, the claim's due scan finds it. Its row lock is
			// skipped, as the counter row's is: held (an operator's open
			// transaction), the lane is left busy, this transaction rolled
			// back, and tried again by the next run; waiting here held the
			// counter row, and every writer of the lane waited behind the
			// sweep (TestSweepHandLiftWaitsOnTheHeadsLockHoldingTheLane).
			var moved, asWritten int64
			if err := tx.QueryRow(ctx, `WITH target AS (
	SELECT event_id FROM `+events+`
	WHERE published_at IS NULL AND quarantined_at IS NULL AND aggregate_type = $1 AND aggregate_id = $2
	  AND aggregate_sequence = $3 AND available_at = occurred_at
	FOR UPDATE SKIP LOCKED
), moved AS (
	UPDATE `+events+` e SET available_at = `+dueAgainSQL()+` FROM target t WHERE e.event_id = t.event_id RETURNING 1
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM `+events+`
	WHERE published_at IS NULL AND quarantined_at IS NULL AND aggregate_type = $1 AND aggregate_id = $2
	  AND aggregate_sequence = $3 AND available_at = occurred_at)`, typ, id, headSeq).Scan(&moved, &asWritten); err != nil {
				return err
			}
			if moved < asWritten {
				return errLaneBusy
			}
			unparked += moved
			_, err = tx.Exec(ctx, `UPDATE `+aggregates+` SET parked_at = NULL, parked_through = NULL
WHERE aggregate_type = $1 AND aggregate_id = $2`, typ, id)
			changed = true
			return err
		}
		from := headSeq
		if isParked && through != nil && *through > from {
			from = *through
		}
		to := min(from+laneSweepBatch, last)
		tag, err := tx.Exec(ctx, `UPDATE `+events+` SET available_at = `+parkedAvailableAt+`
WHERE published_at IS NULL AND aggregate_type = $1 AND aggregate_id = $2
  AND aggregate_sequence > $3 AND aggregate_sequence <= $4
  AND quarantined_at IS NULL AND available_at <> `+parkedAvailableAt, typ, id, from, to)
		if err != nil {
			return err
		}
		parked = tag.RowsAffected()
		_, err = tx.Exec(ctx, `UPDATE `+aggregates+` SET parked_at = coalesce(parked_at, now()), parked_through = $3
WHERE aggregate_type = $1 AND aggregate_id = $2`, typ, id, to)
		changed = true
		return err
	})
	if err != nil && !errors.Is(err, errLaneBusy) {
		err = fmt.Errorf("sweep lane %s/%s: %w", typ, id, err)
	}
	return changed, parked, unparked, err
}

// laneSweepLoop runs the lane sweep at start, then every LaneSweepInterval
// and whenever a settle parked a lane or left one to it (sweepSoon), until
// ctx ends. A run that found lanes busy (a writer's transaction open on
// them) runs again sooner, after a backoff from laneBusyRetryMin doubling up
// to laneBusyRetryMax (or LaneSweepInterval, when shorter), so that a lane a
// settle could not park is parked within seconds of the writer's end,
// without a query per busy lane every few milliseconds while the writer
// stays open.
func (r *Relay) laneSweepLoop(ctx context.Context) {
	busyRuns := 0
	for {
		res, err := sweepLanes(ctx, r.pool, r.schema)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.log.Warn("lane sweep failed", slog.Any("error", err))
		case res.Lanes > 0:
			r.log.Info("lane sweep repaired lanes", slog.Int("lanes", res.Lanes), slog.Int64("events_parked", res.Parked),
				slog.Int64("events_unparked", res.Unparked), slog.Int("lanes_busy", res.Busy))
		}
		wait, ended := r.upkeepWait(r.cfg.LaneSweepInterval)
		if err == nil && res.Busy > 0 {
			busyRuns++
			wait = min(wait, backoffpkg.Exponential(busyRuns, laneBusyRetryMin, laneBusyRetryMax))
		} else {
			busyRuns = 0
		}
		upkeepSleep(ctx, wait, r.cfg.LaneSweepInterval, ended, r.sweep)
		if ctx.Err() != nil {
			return
		}
	}
}

// laneBusyRetryMin and laneBusyRetryMax bound the pause before the lane
// sweep looks again at lanes it found busy.
const (
	laneBusyRetryMin = 100 * time.Millisecond
	laneBusyRetryMax = 5 * time.Second
)

// sweepSoon makes the lane sweep run now (or right after its current run).
func (r *Relay) sweepSoon() {
	select {
	case r.sweep <- struct{}{}:
	default:
	}
}
