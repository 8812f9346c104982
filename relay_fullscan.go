package outbox

// The full scan in the background: once the relay's first claim is done,
// each full scan (the claim that reads every pending event from the start
// of outbox_dispatch_idx, every RescanInterval) runs on a goroutine of its
// own while the main loop goes on with incremental claims, and its batch is
// published by the main loop like any other. Under a transaction held open
// for minutes a full scan walks the index entries of every event published
// since, and took 14 s at 800 events/s six minutes into the pressure bench's
// pinned-xmin cell: inline, each one stopped the relay for that long.
//
// A full scan in the background is two statements: the look (lookSQL),
// which reads where the claim would look, the window and, when the window
// holds no head, the heads past it, without locking a row; then the claim of
// what it found (claimLookedSQL), which locks those rows by primary key and
// decides what to claim exactly as the one-statement claim does. The look
// is what takes long under a pinned xmin; as one statement, the claim held
// every row of its window locked for as long (22 s in the pressure bench),
// including rows another relay had claimed since the scan's snapshot (a row
// locked and then found no longer claimable stays locked to the end of the
// statement), and that relay's marks of them waited: up to 9 s.
//
// Order is kept for the reason the batch claimed ahead keeps it
// (relay_ahead.go): two claims of one relay hold disjoint lanes. A claim
// takes a lane's head only when its predecessor is published, and its
// successors only with it; events leased by the other batch are not
// claimable, and their successors are not heads while they are unpublished.

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// fullScan is the background full scan's state.
type fullScan struct {
	mu      sync.Mutex
	runCtx  context.Context // Run's; nil outside Run
	running bool
	ready   *ahead // a finished full scan's batch, not yet taken
	wg      sync.WaitGroup
}

// backgroundFullScan reports whether a due full scan runs in the background:
// not while every claim is a full scan (a negative RescanInterval), and not
// the relay's first (the cursor starts from its snapshot; the relay's
// start-up takes over expired leases at once).
func (r *Relay) backgroundFullScan() bool {
	return r.cfg.RescanInterval >= 0 && r.cursor.isValid() && !r.cursor.lastFullAt().IsZero()
}

// startFullScan starts a full scan on its own goroutine, unless one is
// running or its batch has not been taken yet.
func (r *Relay) startFullScan() {
	f := &r.full
	f.mu.Lock()
	defer f.mu.Unlock()
	// The scan runs under Run's context, not its caller's (a claim ahead
	// runs uncancelled): once Run's ends, none starts, and a running one is
	// cancelled, so that the relay's stop never waits for a long scan.
	ctx := f.runCtx
	if f.running || f.ready != nil || ctx == nil || ctx.Err() != nil {
		return
	}
	f.running = true
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		start := time.Now()
		// Cancelled with ctx: the relay does not wait, when it stops, for a
		// scan that may take long; a cancelled claim claims nothing.
		b, err := r.claimKind1(ctx, claimFullLooked)
		a := &ahead{b: b, dur: time.Since(start), err: err}
		f.mu.Lock()
		f.running = false
		f.ready = a
		f.mu.Unlock()
		if err == nil && b.total > 0 {
			r.Wake() // an idle main loop takes it now
		}
	}()
}

// fullScanReady reports whether a finished full scan's batch waits to be
// taken.
func (r *Relay) fullScanReady() bool {
	f := &r.full
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready != nil
}

// takeFullScan returns the batch of a finished background full scan, if
// any.
func (r *Relay) takeFullScan() (*ahead, bool) {
	f := &r.full
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.ready
	f.ready = nil
	return a, a != nil
}

// runFullScans lets full scans run in the background under ctx, Run's.
func (r *Relay) runFullScans(ctx context.Context) {
	r.full.mu.Lock()
	r.full.runCtx = ctx
	r.full.mu.Unlock()
}

// dropFullScan waits for a background full scan (cancelled with Run's
// context, so it ends at once) and releases its batch when it was not
// taken (the relay stops). A scan cancelled after its statement committed
// returns an error, not its rows, and leaves them leased: those are
// released by the claim's token (TestClaimAheadReleasedOnShutdown saw 20
// events leased for the lease's length after a stop).
func (r *Relay) dropFullScan(ctx context.Context) {
	r.full.mu.Lock()
	r.full.runCtx = nil
	r.full.mu.Unlock()
	r.full.wg.Wait()
	a, ok := r.takeFullScan()
	if !ok {
		return
	}
	if a.err != nil {
		if _, err := r.planned(r.pool).Exec(context.WithoutCancel(ctx), r.sql.releaseToken, a.b.token); err != nil {
			r.log.Warn("release a cancelled full scan's claim (its lease will expire)", slog.Any("error", err))
		}
		return
	}
	if a.b.total == 0 {
		return
	}
	if err := r.release(context.WithoutCancel(ctx), a.b, allIDs(a.b)); err != nil {
		r.log.Warn("release the full scan's batch (its lease will expire)", slog.Any("error", err))
	}
}

// lookSQL is the background full scan's look: the ids of the full scan's
// window (the oldest claimable events, a quarter more than the batch) and,
// when no row of the window is the head of its lane, of the oldest heads
// past it (at most a batch), and the heads committed late behind its bound
// (below), as one array, in one read that locks nothing. extra is the
// relay's further condition on a row e (see claimSQL). The claim that
// follows (claimLookedSQL) re-checks all of it.
//
// It reads outbox_dispatch_idx from ($1, $2), a position of its key
// (available_at, occurred_at): the look's low-water mark (lowMark), or
// (-infinity, -infinity) for a complete look. A transaction that was
// running at the previous look's snapshot, or began after it, may have
// committed an event behind that bound since (its available_at is its
// start): a writer that began before the mark and wrote late. Those events
// are the ones whose dispatch_xid is in the previous look's running
// transactions ($4) or at or past its xmax ($3): late reads them from
// outbox_fresh_key_idx, the entries written since the previous look, as
// the incremental claim's cursor does. Its heads join the window; the
// oldest of them, claimable or not (a successor whose predecessor is leased),
// holds the next mark back (the late low), so that the next look reads it
// from outbox_dispatch_idx. Rows without a dispatch_xid (written by hand,
// or by a writer from before migration 009) are left to the complete look.
//
// It also returns where the next look may start, the position of the
// oldest pending event that is not quarantined (leased or not, due or not)
// at or past the bound, or NULL when there is none, the late low, the
// statement's now() and its snapshot.
func lookSQL(events string, batchSize int, extra string) string {
	limit, window := strconv.Itoa(batchSize), strconv.Itoa(batchSize+batchSize/4)
	// One walk: low reads outbox_dispatch_idx from the bound up to the
	// oldest pending event, and the window starts there. Every claimable
	// row is pending and not quarantined, so none lies between the bound
	// and low. Both reading from the bound, a complete look under a pinned
	// xmin walked the entries of every event published since twice (180,000
	// buffers each in the pressure bench after ten minutes at 800 events/s).
	cond := windowCond(extra) + `
	  AND (e.available_at, e.occurred_at) >= ((SELECT available_at FROM low), (SELECT occurred_at FROM low))`
	lateCols := `e.event_id, e.published_at, e.quarantined_at, e.available_at, e.occurred_at, e.claim_until, e.claimed_by,
		e.aggregate_type, e.aggregate_id, e.aggregate_sequence`
	latePending := `coalesce(e.published_at, e.quarantined_at) IS NULL AND e.dispatch_xid IS NOT NULL
		  AND e.available_at = e.occurred_at
		  AND (e.available_at, e.occurred_at) < ($1::timestamptz, $2::timestamptz)`
	return `WITH low AS (
	SELECT e.available_at, e.occurred_at FROM ` + events + ` e
	WHERE e.published_at IS NULL AND e.quarantined_at IS NULL
	  AND (e.available_at, e.occurred_at) >= ($1::timestamptz, $2::timestamptz)
	ORDER BY e.available_at, e.occurred_at
	LIMIT 1
), scan AS (
	SELECT e.event_id, e.claimed_by, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.available_at, e.occurred_at
	FROM ` + events + ` e
	WHERE ` + cond + `
	ORDER BY e.available_at, e.occurred_at
	LIMIT ` + window + `
), scan_heads AS (` + windowHeadsSQL(events, "1") + `
), blocked AS (
	SELECT NOT EXISTS (SELECT 1 FROM scan_heads) AND EXISTS (SELECT 1 FROM scan) AS beyond
), beyond AS (
	SELECT e.event_id FROM ` + events + ` e
	WHERE (SELECT beyond FROM blocked)
	  AND ` + cond + `
	  AND ` + isHead(events, "e") + `
	ORDER BY e.available_at, e.occurred_at
	LIMIT ` + limit + `
), late_all AS MATERIALIZED (
	SELECT ` + lateCols + ` FROM ` + events + ` e
	WHERE ` + latePending + `
	  AND e.dispatch_xid >= $3::text::xid8
	UNION
	SELECT ` + lateCols + ` FROM unnest($4::text[]::xid8[]) AS x(xid)
	CROSS JOIN LATERAL (
		SELECT * FROM ` + events + ` e
		WHERE ` + latePending + `
		  AND e.dispatch_xid = x.xid
		OFFSET 0) e
), late AS (
	SELECT e.event_id FROM late_all e
	WHERE ` + windowCond(extra) + `
	  AND ` + isHead(events, "e") + `
	ORDER BY e.available_at, e.occurred_at
	LIMIT ` + limit + `
), late_low AS (
	SELECT e.available_at, e.occurred_at FROM late_all e
	ORDER BY e.available_at, e.occurred_at
	LIMIT 1
)
SELECT coalesce(array_agg(DISTINCT i.event_id), '{}'), (SELECT available_at FROM low), (SELECT occurred_at FROM low),
	(SELECT available_at FROM late_low), (SELECT occurred_at FROM late_low), now(), pg_current_snapshot()::text FROM (
	SELECT event_id FROM scan UNION ALL SELECT event_id FROM beyond UNION ALL SELECT event_id FROM late) i`
}

// claimLookedSQL is the background full scan's claim of the events its look
// found ($5, an array of ids; $1 to $4 as in claimSQL): the rows are locked
// (SKIP LOCKED) one primary-key lookup each, in a subquery of their own
// (OFFSET 0) so that the claimable conditions cannot turn the lookups into
// a scan, re-checked on their newest version, and then taken as claimSQL
// takes its window: the heads among them, oldest first, and their
// successors. The look only decides where the claim looks, never what it
// may claim, as for the incremental claim.
func claimLookedSQL(events string, batchSize int, extra string) string {
	return `WITH scan AS (
	SELECT e.event_id, e.claimed_by, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.available_at, e.occurred_at
	FROM unnest($5::uuid[]) AS i(id)
	CROSS JOIN LATERAL (
		SELECT * FROM ` + events + ` e WHERE e.event_id = i.id OFFSET 0 FOR UPDATE SKIP LOCKED) e
	WHERE ` + windowCond(extra) + `
), heads AS (` + windowHeadsSQL(events, strconv.Itoa(batchSize)) + `
), ` + claimHeadsSQL(events)
}

// claimLooked runs the background full scan's two statements into b: the
// look, then, when it found anything, the claim of what it found.
func (r *Relay) claimLooked(ctx context.Context, q querier, b *batch) (int64, error) {
	var ids []uuid.UUID
	var lowAvail, lowOcc, lateAvail, lateOcc *time.Time
	var now time.Time
	var snap string
	start := time.Now()
	from, complete := r.cursor.lookFrom(start, r.completeLookEvery())
	xmax, xip := from.lateArgs()
	if err := q.QueryRow(ctx, r.sql.look, from.avail, from.occ, xmax, xip).
		Scan(&ids, &lowAvail, &lowOcc, &lateAvail, &lateOcc, &now, &snap); err != nil {
		r.cursor.lookFailed(complete, start, time.Since(start), r.lookMargin())
		return 0, fmt.Errorf("claim batch: full scan: %w", err)
	}
	if lateAvail != nil && lateOcc != nil && (lowAvail == nil || lateAvail.Before(*lowAvail) ||
		(lateAvail.Equal(*lowAvail) && lowOcc != nil && lateOcc.Before(*lowOcc))) {
		lowAvail, lowOcc = lateAvail, lateOcc
	}
	next := nextLowMark(lowAvail, lowOcc, now, r.lookMargin())
	if err := next.setSnapshot(snap); err != nil {
		return 0, err
	}
	r.cursor.lookDone(next, complete, start, time.Since(start))
	if len(ids) == 0 {
		return 0, nil
	}
	rows, err := q.Query(ctx, r.sql.claimLooked, r.cfg.BatchSize, r.cfg.ID, b.token, r.cfg.LeaseDuration.Milliseconds(), ids)
	if err != nil {
		return 0, fmt.Errorf("claim batch: %w", err)
	}
	return scanClaimed(rows, b)
}

// lowMark is where the background full scan's look starts reading
// outbox_dispatch_idx: a position (available_at, occurred_at) of its key.
// The zero lowMark (both -infinity) reads it from the start: a complete
// look.
type lowMark struct {
	avail, occ pgtype.Timestamptz
	// xmax and xip are the snapshot of the look that set the mark: the
	// next look reads the events of the transactions it did not see
	// (lookSQL's late), which may lie behind the mark.
	xmax uint64
	xip  []string
}

// lateArgs are lookSQL's $3 and $4: the previous look's xmax and running
// transactions, or, without a previous look's snapshot (a complete look,
// a mark set after a failed one), an empty range: nothing to read late.
func (m lowMark) lateArgs() (xmax string, xip []string) {
	if m.xmax == 0 {
		return strconv.FormatUint(math.MaxInt64, 10), nil
	}
	return strconv.FormatUint(m.xmax, 10), m.xip
}

// setSnapshot records the look's snapshot (pg_snapshot's text form).
func (m *lowMark) setSnapshot(snap string) error {
	_, xmax, xip, err := parseSnapshot(snap)
	if err != nil {
		return err
	}
	m.xmax, m.xip = xmax, make([]string, len(xip))
	for i, x := range xip {
		m.xip[i] = strconv.FormatUint(x, 10)
	}
	return nil
}

// lowMarkStart is the position before every entry.
var lowMarkStart = lowMark{
	avail: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
	occ:   pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
}

// nextLowMark is where the next look may start: at the oldest pending event
// that is not quarantined, as the last look found it (lowAvail, lowOcc; nil
// when it found none), but never later than margin before the look's now().
// Under a transaction holding the xmin, the entries of every event
// published since stay in outbox_dispatch_idx; reading from the start, a
// look walks all of them (5.8 s a look after ten minutes at 800 events/s),
// from the mark only those of the last margin. The margin is for what a
// later transaction can still put behind the mark: a row committed late with
// an old available_at (written by hand, or without dispatch_xid, which the
// incremental claim's cursor does not see), a reschedule whose transaction
// started before the look. What falls further behind, a complete look
// finds (completeLookEvery).
func nextLowMark(lowAvail, lowOcc *time.Time, now time.Time, margin time.Duration) lowMark {
	floor := now.Add(-margin)
	if lowAvail == nil || lowOcc == nil || !lowAvail.Before(floor) {
		return lowMark{
			avail: pgtype.Timestamptz{Time: floor, Valid: true},
			occ:   pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
		}
	}
	return lowMark{avail: pgtype.Timestamptz{Time: *lowAvail, Valid: true}, occ: pgtype.Timestamptz{Time: *lowOcc, Valid: true}}
}

// lookMargin is how far before the look's now() a low-water mark may be at
// most (nextLowMark): two rescan intervals, ten seconds by default. Under a
// pinned xmin a look walks the dead entries of that long: at 800 events/s a
// minute of them cost 148,000 buffers a look in the pressure bench.
func (r *Relay) lookMargin() time.Duration { return 2 * max(r.cfg.RescanInterval, 0) }

// completeLookEvery is how often a look reads outbox_dispatch_idx from its
// start all the same: sixty rescan intervals, five minutes by default. It is
// the backstop of the backstop: whatever a transaction put behind the
// low-water mark is found within that time.
func (r *Relay) completeLookEvery() time.Duration { return 60 * max(r.cfg.RescanInterval, 0) }
