package outbox

// Claiming given events: the seam between a change-data-capture relay
// (package outboxcdc), which learns event ids from the WAL in commit order,
// and the relay's claim, publish and settle machinery. The argument:
// docs/design.md, "Change-data capture".

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgretry"
)

// PublishIDsResult is what one PublishIDs call did with its ids.
type PublishIDsResult struct {
	// Published counts the ids the destination acknowledged in this call.
	// They are marked published (unless another relay had taken them over
	// meanwhile, which RelayStats.LeaseConflicts counts) before the call
	// returns, or, when every event of the call was acknowledged, in the
	// background (see WaitPublishIDs).
	Published int
	// Left counts the ids this call did not publish, left to the polling
	// path: not claimable now (already published, leased by another relay,
	// quarantined, backing off, behind an unpublished or quarantined event of
	// their aggregate that was not among the ids, or unknown), failed and
	// recorded with a backoff or a quarantine (see Failed), or claimed and
	// released unattempted (the lease's time ran out, shutdown). The outbox
	// table records all of them; a polling relay publishes each when it is
	// due.
	Left int
	// Failed counts, among Left, the events whose publish failed.
	Failed int
	// PublishedIDs are the ids the destination acknowledged in this call
	// (Published of them). A caller must not infer them from the table: an
	// event this relay claimed and never published carries its lease too,
	// after a failed call (a broken Publisher, a database error while
	// settling) or a crash of a process with the same relay ID.
	PublishedIDs []uuid.UUID
	// Missing lists, among Left, the ids of which the table held no event
	// when the call looked (and that its claim, a moment later, did not
	// take either). PostgreSQL sends a commit to logical
	// replication a moment before the transaction is visible to other
	// sessions, so an id read from the WAL can be missing briefly: the
	// caller should retry those shortly, and give up after a while (an
	// event deleted by clean-up stays missing).
	Missing []uuid.UUID
	// Unavailable reports that the destination was unavailable as a whole
	// (see Unavailable: nothing of the call was published, or the relay is
	// in an outage and its probe failed, in which case nothing was claimed):
	// the caller should wait RetryIn and call again with the same ids before
	// treating them as handled. The events that met the outage were
	// released untouched.
	Unavailable bool
	// RetryIn is the wait before the next call when Unavailable: the
	// relay's wait before its next look at the destination (at most
	// RelayConfig.OutageProbeMax), or the longest delay the destination
	// asked for with RetryAfter, if longer.
	RetryIn time.Duration
}

// errPublishIDsRunning is returned by PublishIDs on a relay whose Run is
// going.
var errPublishIDsRunning = errors.New("outbox: PublishIDs on a relay whose Run is going; give it a Relay of its own")

// PublishIDs publishes those of the given events that are claimable now, in
// order per aggregate, and settles them, exactly as Run does with the events
// it claims: the same lease, the same fenced marks, failure records,
// backoff and quarantine, the same Publisher calls (waves, or one call to an
// ordered pipeliner). It is how a change-data-capture relay publishes the
// events it read from the WAL; the outbox table stays the truth.
//
// An event is claimed when it is unpublished, not quarantined, due, not
// under a live lease, and either the head of its aggregate's lane (the
// aggregate's previous event is published) or the contiguous successor of
// a claimed event among ids. An aggregate's events are therefore never
// claimed out of order, by this call or between it and any polling relay,
// and the ids may come in any order. Whatever is not claimed is counted in
// Left and left to the polling path (see PublishIDsResult.Left); so is an
// event that fails.
//
// When the destination acknowledged every event the call claimed, the call
// returns with the acks and writes the marks in the background, so that the
// caller can read on and call again while they are written: the next call's
// claim counts those events as published (they are), and waits for their
// marks before it settles its own, so marks are written in sequence order.
// WaitPublishIDs waits for them; a caller does so before it stops. A call
// with failures settles them before it returns, as Run does.
//
// The error is for the database (claim or settle failed, here or in the
// previous call's background marks); the destination's failures are in the
// result. Publishing goes on for up to ShutdownTimeout after ctx ends, so
// acknowledged work is marked.
//
// PublishIDs calls are serialised, and PublishIDs refuses to run on a relay
// whose Run is going (the two would share the relay's outage count): give a
// CDC path a Relay of its own, with its own ID.
func (r *Relay) PublishIDs(ctx context.Context, ids []uuid.UUID) (PublishIDsResult, error) {
	var res PublishIDsResult
	ids = uniqueIDs(ids)
	if len(ids) == 0 {
		return res, nil
	}
	r.idsMu.Lock()
	defer r.idsMu.Unlock()
	if r.running.Load() {
		return res, errPublishIDsRunning
	}
	r.partitionAware(ctx)
	acked, err := r.pendingMarks()
	if err != nil {
		return res, err
	}
	r.probeRoutes(ctx)
	if r.outages > 0 && !r.probeOutage(ctx) {
		// Still unavailable: claim nothing, look again after the wait.
		res.Left, res.Unavailable, res.RetryIn = len(ids), true, r.outageWait()
		return res, nil
	}
	start := time.Now()
	b, missing, err := r.claimIDs(ctx, ids, acked)
	r.observeClaim(b, time.Since(start), err, false)
	if err != nil {
		return res, err
	}
	res.Missing = missing
	res.Left = len(ids) - b.total
	if b.total == 0 {
		return res, nil
	}
	if err := failpoint.Hit("relay/after-claim"); err != nil {
		res.Left = len(ids)
		return res, r.release(context.WithoutCancel(ctx), b, allIDs(b))
	}
	workCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ShutdownTimeout, cancel)
		context.AfterFunc(workCtx, func() { t.Stop() })
	})
	defer stop()
	var o outcome
	if r.pipelined {
		o, err = r.publishPipelined(workCtx, b)
	} else {
		o, err = r.publishWaves(workCtx, b)
	}
	if err != nil {
		// A broken Publisher or a failpoint: the batch's lease expires, as
		// with a crash, and the events go back to the table.
		res.Left = len(ids)
		return res, err
	}
	// The previous call's marks come first: a lane's events are marked in
	// sequence order, and an event published here behind one of them is
	// never marked while that one is not.
	if err := r.awaitMarks(workCtx); err != nil {
		res.Left = len(ids)
		return res, err // this batch's leases expire; see WaitPublishIDs
	}
	outagesBefore := r.outages
	if len(o.failures) == 0 && len(o.published) == b.total {
		r.settleBookkeeping(&o)
		r.markInBackground(workCtx, b, o.published)
	} else {
		// After the bookkeeping, o.failures holds only the failures to
		// record: the events that met an outage are released untouched.
		r.settleBookkeeping(&o)
		if err := r.settleOutcome(workCtx, b, o); err != nil {
			res.Left = len(ids)
			return res, err
		}
	}
	res.Published = len(o.published)
	res.PublishedIDs = o.published
	res.Failed = len(o.failures)
	res.Left = len(ids) - res.Published
	if r.outages > outagesBefore {
		// Look again after the outage wait, or once the events the
		// destination asked to wait are due again, so that the retry claims
		// them instead of leaving them to the polling path.
		res.Unavailable = true
		res.RetryIn = r.outageWait()
		for _, f := range o.failures {
			if f.outage && f.route == "" {
				res.RetryIn = max(res.RetryIn, f.delay)
			}
		}
	}
	return res, nil
}

// claimIDs claims, under a new lease, those of ids that are claimable (see
// claimIDsSQL), grouped into lanes in sequence order; the acked events
// (this relay's, acknowledged and being marked) count as published. It also returns the
// ids that had no row just before the claim (and so none at the claim
// either, a later snapshot: an event that became visible in between is
// claimed or not like any other). Both statements go in one round trip.
func (r *Relay) claimIDs(ctx context.Context, ids, acked []uuid.UUID) (batch, []uuid.UUID, error) {
	token := uuid.New()
	start := time.Now()
	args := uuidArgs(ids)
	var b batch
	var absent [][16]byte
	var takenOver int64
	// A claim whose connection was lost (killed, or dead in the pool) is
	// tried again on another, with the same token: when the lost attempt
	// committed unseen, its rows are leased under that token and the
	// statement takes them again (claimIDsSQL), instead of leaving them to
	// wait for their lease (issue 24).
	err := pgretry.Do(ctx, start.Add(min(claimRetryFor, r.cfg.LeaseDuration/4)), func(ctx context.Context, _ pgretry.Attempt) error {
		b = batch{token: token}
		var q pgx.Batch
		q.Queue(r.sql.missingIDs, args)
		q.Queue(r.sql.claimIDs, args, r.cfg.ID, token, r.cfg.LeaseDuration.Milliseconds(), uuidArgs(acked))
		res := r.planned(r.pool).SendBatch(ctx, &q)
		defer res.Close()
		if err := res.QueryRow().Scan(&absent); err != nil {
			return fmt.Errorf("claim events by id: %w", err)
		}
		rows, err := res.Query()
		if err != nil {
			return fmt.Errorf("claim events by id: %w", err)
		}
		if takenOver, err = scanClaimed(rows, &b); err != nil {
			return err
		}
		if err := res.Close(); err != nil {
			return fmt.Errorf("claim events by id: %w", err)
		}
		return nil
	})
	if err != nil {
		return batch{token: token}, nil, err
	}
	// An id missing at the check may be claimed all the same: the claim's
	// snapshot is later, and a commit that became visible in between is
	// claimed like any other. Missing lists only the ids the claim did not
	// take.
	claimed := make(map[uuid.UUID]bool, b.total)
	for _, id := range allIDs(b) {
		claimed[id] = true
	}
	var missing []uuid.UUID
	for _, id := range absent {
		if !claimed[id] {
			missing = append(missing, id)
		}
	}
	r.takenOver.Add(takenOver)
	b.takenOver = int(takenOver)
	if cut := orderLanes(b.lanes); len(cut) > 0 {
		r.log.Error("claim by id returned a lane with a gap; releasing the events after it", slog.Int("events", len(cut)))
		b.total -= len(cut)
		if err := r.release(ctx, b, cut); err != nil {
			return b, missing, err
		}
	}
	if b.undecodableHead() {
		// A head claimed behind events whose marks are being written
		// (acked) is quarantined only once those marks are written, as a
		// call settles its own events only after the previous call's
		// marks: the table then never shows a quarantined event behind an
		// unpublished one. On error the batch's leases expire.
		if err := r.awaitMarks(ctx); err != nil {
			return b, missing, err
		}
	}
	if err := r.quarantineUndecodable(ctx, &b); err != nil {
		return b, missing, err
	}
	b.deadline = start.Add(r.cfg.LeaseDuration * 8 / 10)
	b.leaseEnd = start.Add(r.cfg.LeaseDuration)
	r.claimed.Add(int64(b.total))
	return b, missing, nil
}

// missingIDsSQL returns, as one array, those of the ids ($1) that have no
// event row. OFFSET 0 keeps the NOT EXISTS a probe of the primary key per
// id: as an anti-join PostgreSQL may hash the whole table, which it does
// when its statistics are older than the table's growth (a new outbox, or
// a busy one between two ANALYZEs) and which cost 2.5 ms a call on 30,000
// rows, at every call.
func missingIDsSQL(events string) string {
	return `SELECT coalesce(array_agg(i.id), '{}') FROM unnest($1::uuid[]) AS i(id)
WHERE NOT EXISTS (SELECT 1 FROM ` + events + ` e WHERE e.event_id = i.id OFFSET 0)`
}

// claimIDsExcept is claimIDsSQL's condition on a head's predecessor p that
// counts it as published: it is among the ids this relay acknowledged and
// is still marking ($5).
const claimIDsExcept = "p.event_id = ANY ($5::uuid[])"

// claimIDsSQL is the claim of given events ($1, an array of ids; $2 to $4
// as in the polling claim; $5, the ids this relay has acknowledged and is
// still marking): one statement, returning the polling claim's columns.
//
// It locks (SKIP LOCKED) the ids' rows, one primary-key lookup each, and
// keeps those that are claimable on their newest row version (the locked
// one). The lookup sits in its own subquery (OFFSET 0) so that PostgreSQL
// cannot push the claimable conditions into it: with them it may pick the
// dispatch index's range scan over every pending row for each id, which it
// did with statistics taken while the table was young (one lookup then cost
// as much as a scan of the backlog). A row that is not claimable (already
// published, say) is locked for the statement's short transaction and left.
//
// Per aggregate, the lowest locked sequence (lowest carries its event_id:
// on a partitioned outbox the head check looks for the predecessor near
// it, see partitionedSQL) must be the lane's head
// (isHead: its predecessor is published, or is among $5: the destination
// acknowledged it and its mark is on its way, see idsMarks); the claim
// takes it and the locked events that follow it without a gap. A lane whose
// lowest candidate is not its head (an earlier event is unpublished:
// pending, leased, backing off, quarantined, or locked by another claim),
// and a lane's candidates after a gap, are not claimed. So a relay never
// holds k+1 without k, nor k+1 while k is unpublished and unacknowledged,
// as with the polling claim; a stale snapshot of the head check can only
// exclude more events.
//
// Unlike the polling claim, the UPDATE joins the candidates alone: the
// candidates' estimate (one row, after the run filter) already makes
// PostgreSQL look each one up by primary key, and the polling claim's
// second condition (event_id = ANY of the candidates) made each of those
// lookups walk the whole array: 130 ms instead of 20 ms for 1,000 ids.
func claimIDsSQL(events string) string {
	return `WITH locked AS (
	SELECT e.event_id, CASE WHEN e.claim_token = $3 THEN NULL ELSE e.claimed_by END AS claimed_by,
		e.aggregate_type, e.aggregate_id, e.aggregate_sequence
	FROM unnest($1::uuid[]) AS i(id)
	CROSS JOIN LATERAL (
		SELECT * FROM ` + events + ` e WHERE e.event_id = i.id OFFSET 0 FOR UPDATE SKIP LOCKED) e
	WHERE ` + claimableNowOrOwn("e") + `
), lowest AS (
	SELECT DISTINCT ON (l.aggregate_type, l.aggregate_id) l.event_id, l.aggregate_type, l.aggregate_id, l.aggregate_sequence
	FROM locked l
	ORDER BY l.aggregate_type, l.aggregate_id, l.aggregate_sequence
), heads AS (
	SELECT h.* FROM lowest h WHERE ` + isHeadExcept(events, "h", claimIDsExcept) + `
), candidates AS (
	SELECT r.event_id, r.claimed_by, r.k = 0 AS head FROM (
		SELECT l.event_id, l.claimed_by, l.aggregate_sequence - h.aggregate_sequence AS k,
			row_number() OVER (PARTITION BY l.aggregate_type, l.aggregate_id ORDER BY l.aggregate_sequence) - 1 AS rn
		FROM locked l
		JOIN heads h ON h.aggregate_type = l.aggregate_type AND h.aggregate_id = l.aggregate_id) r
	WHERE r.k = r.rn
)
UPDATE ` + events + ` e
SET claimed_by = $2, claim_token = $3, claim_until = now() + $4 * interval '1 millisecond'
FROM candidates c
WHERE e.event_id = c.event_id
RETURNING ` + messageColumnsSkipped(events, "e", `CASE WHEN c.head THEN `+skippedFromSQL(events, "e")+` ELSE 0 END`) + `, e.attempt_count, c.claimed_by`
}

// claimRetryFor bounds how long a claim by id is tried again after a lost
// connection (at most a quarter of the lease).
const claimRetryFor = 2 * time.Second

// claimableNowOrOwn is claimableNow, or leased under this claim's own token
// ($3): the rows of an attempt whose connection was lost after it committed.
func claimableNowOrOwn(e string) string {
	return e + `.published_at IS NULL
	  AND ` + e + `.quarantined_at IS NULL
	  AND (` + e + `.available_at <= now() OR ` + e + `.available_at = ` + e + `.occurred_at)
	  AND (` + e + `.claim_until IS NULL OR ` + e + `.claim_until < now() OR ` + e + `.claim_token = $3)`
}

// uniqueIDs returns ids without repeats, keeping the first of each.
func uniqueIDs(ids []uuid.UUID) []uuid.UUID {
	seen := make(map[uuid.UUID]struct{}, len(ids))
	out := ids[:0:0]
	for _, id := range ids {
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out
}
