package outbox

// Claiming only what is new: the relay remembers where its last claim left
// off, a snapshot of transaction ids, and next reads only the events written
// since, the events whose backoff or operator action made them due, and the
// next events of the lanes it has just published. A periodic full scan (the
// claim of relay_sql.go) catches what this misses: leases of relays that
// died, events of an upgraded table. The argument: docs/design.md, "Claiming
// only what is new".

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// RescanIntervalDefault is the default RelayConfig.RescanInterval.
const RescanIntervalDefault = 5 * time.Second

// claimWindow is how many rows each of the incremental claim's scans reads
// for a batch of batchSize: a quarter more than the batch, and at least
// minClaimWindow. A window full of rows of one transaction that cannot be
// claimed holds the cursor at that transaction (see advance); with a batch
// of 1 a window of 1 was one such row: the successor of a quarantined head
// whose lane an application's open transaction kept from being parked held
// every other event until the lane sweep (found by TestInterleavings).
func claimWindow(batchSize int) int { return max(batchSize+batchSize/4, minClaimWindow) }

const minClaimWindow = 16

// contKeepFactor bounds the lanes an incremental claim looks for again
// (claimCursor.cont) to this many windows.
const contKeepFactor = 4

// aheadKeepFactor bounds the lanes set aside until the cursor reaches their
// next event (claimCursor.ahead) to this many windows; the rest are handed
// over (claimCursor.over).
const aheadKeepFactor = 16

// contRetries is how many claims a lane's next event is looked for while a
// concurrent claim statement holds it locked (see claimCursor.cont); then
// it is handed over (claimCursor.over), never dropped.
const contRetries = 3

// cursorPos is a place in outbox_fresh_key_idx: a transaction id and an
// event id, in that order. The zero id is before every event of the
// transaction: the cursor keeps its place inside a transaction only once
// it has read that transaction's events, all committed together, so none
// can appear before its place later (migration 014).
type cursorPos struct {
	xid uint64
	id  uuid.UUID
}

// compare orders positions as outbox_fresh_key_idx does: -1, 0 or +1.
func (p cursorPos) compare(q cursorPos) int {
	if c := cmp.Compare(p.xid, q.xid); c != 0 {
		return c
	}
	return bytes.Compare(p.id[:], q.id[:])
}

// before reports whether p sorts before q.
func (p cursorPos) before(q cursorPos) bool { return p.compare(q) < 0 }

// parseCursorPos reads the "xid/event_id" text of the incremental claim's
// report.
func parseCursorPos(s string) (cursorPos, error) {
	x, id, ok := strings.Cut(s, "/")
	if !ok {
		return cursorPos{}, fmt.Errorf("claim cursor: position %q", s)
	}
	v, err := strconv.ParseUint(x, 10, 64)
	if err != nil {
		return cursorPos{}, fmt.Errorf("claim cursor: position %q: %w", s, err)
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return cursorPos{}, fmt.Errorf("claim cursor: position %q: %w", s, err)
	}
	return cursorPos{xid: v, id: u}, nil
}

// laneNext is the next sequence of a lane the relay published up to.
type laneNext struct {
	typ, id string
	seq     int64
	tries   int
}

// laneAhead is a lane whose next event lies at pos, at or past the cursor.
type laneAhead struct {
	laneNext
	pos cursorPos
}

// claimCursor is where a relay's incremental claim starts.
//
// Every pending event that is not quarantined and is as written
// (available_at = occurred_at; a scheduled one, available_at <>
// occurred_at, is in outbox_due_idx) has a (dispatch_xid, event_id)
// at or past from, or a dispatch_xid in points, or is the next event of a lane in cont, or is one
// that only the full scan finds (leased by a relay that died; written
// before migration 009). Claims keep that true as they move from forward.
type claimCursor struct {
	mu sync.Mutex
	// conservative: the cursor never passes a pending event it read and
	// did not claim (a relay with ReconcileAfter, which leaves young
	// events to the CDC stream and must still see them once they are old).
	conservative bool
	valid        bool
	from         cursorPos // where the range scan starts, inclusive
	points       []uint64  // transactions below from.xid that were running at the last snapshot
	cont         []laneNext
	// over: lanes beyond contKeepFactor windows of cont, to make due
	// before the next incremental claim (claimFresh).
	over []laneNext
	// ahead: lanes of cont whose next event the claim found at or past
	// from. The range scan reads it there, so it is not looked for by key
	// (nor locked) at every claim; once from passes it, the lane goes back
	// to cont and is looked for once more (advance, settleAhead).
	ahead []laneAhead
	// lastFull is when the last full scan ran and lastFullCost how long it
	// took; fullAgain asks for another one at once (the last full scan
	// returned a full batch).
	lastFull     time.Time
	lastFullCost time.Duration
	fullAgain    bool
	// low is where the background full scan's next look starts (zero: from
	// the start), lastComplete when a look last read from the start
	// (relay_fullscan.go, nextLowMark), and how long that took.
	low              lowMark
	lastComplete     time.Time
	lastCompleteCost time.Duration
}

// fullScanDuty bounds the share of a relay's time spent in full scans: after
// a full scan that took d, the next one waits at least (1/fullScanDuty - 1)
// × d, whatever RescanInterval or a full batch asks. The full scan walks
// the index entries of every event published since vacuum last could clean
// them: under a transaction held open for minutes, seconds of them. Without
// the bound a backlog made every claim a full scan (a full batch asks for
// another at once), each slower than the last, and the relays fell further
// behind the longer the transaction stayed open (issue 24: a backlog of
// 58,000 after ten minutes at 800 events/s). Cheap full scans (milliseconds)
// are not delayed in practice.
const fullScanDuty = 0.05

// fullScanRestMax bounds fullScanDuty's rest to this many rescan intervals
// (a minute by default). A full scan's time counts its waits too: a look
// queued 3 s behind an ALTER TABLE's lock put the next one a minute away
// (TestAdv24CompleteLookSpacedByALockWait), and one queued for a minute
// would have put it 19 minutes away. The looks that are expensive under a
// pinned xmin, the complete ones, have a duty bound of their own
// (completeLookDuty); a look from the low-water mark reads the last
// seconds of entries.
const fullScanRestMax = 12

// claimKind is how the next claim looks for events.
type claimKind int

const (
	claimFull  claimKind = iota // the full scan (relay_sql.go claimSQL)
	claimFresh                  // only what is new (fastClaimSQL)
	// claimFullLooked is the full scan in the background: a look that
	// locks nothing, then a claim of what it found (relay_fullscan.go).
	claimFullLooked
)

// nextKind decides the next claim's kind: the full scan when the cursor is
// not set, when RescanInterval has passed since the last one, or when the
// last one filled its batch; else the incremental claim.
func (c *claimCursor) nextKind(now time.Time, rescan time.Duration) claimKind {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rescan < 0 {
		return claimFull
	}
	rest := min(time.Duration(float64(c.lastFullCost)*(1/fullScanDuty-1)), fullScanRestMax*rescan)
	if since := now.Sub(c.lastFull) - c.lastFullCost; since < rest {
		return claimFresh // see fullScanDuty
	}
	if c.fullAgain || now.Sub(c.lastFull) >= rescan {
		return claimFull
	}
	return claimFresh
}

// lastFullAt is when the last full scan started (zero: none yet).
func (c *claimCursor) lastFullAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastFull
}

// fullDone records a full scan that started at start, took cost and
// returned n events of a batch of size.
func (c *claimCursor) fullDone(start time.Time, cost time.Duration, n, size int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastFull, c.lastFullCost = start, cost
	c.fullAgain = n >= size
}

// lookFrom is where the background full scan's look starts: the low-water
// mark, or the start of the index when there is none or when a complete look
// is due: every completeEvery, and at least completeLookDuty of the last
// complete look's cost apart.
func (c *claimCursor) lookFrom(now time.Time, completeEvery time.Duration) (lowMark, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	every := max(completeEvery, min(time.Duration(float64(c.lastCompleteCost)/completeLookDuty), completeLookSpacingMax))
	if !c.low.avail.Valid || now.Sub(c.lastComplete) >= every {
		return lowMarkStart, true
	}
	return c.low, false
}

// completeLookDuty bounds the share of a relay's time spent in complete
// looks (lookFrom). A complete look walks the index entries of every event
// published since vacuum last could clean them: under a transaction held
// open for six minutes at 800 events/s it took 19 s in the pressure bench,
// and one every five minutes per relay took a core's tenth for nothing, as
// it is the backstop for the rare event that a look from the low-water mark
// cannot see (nextLowMark). At 1% a 10 s complete look comes every 17
// minutes; the looks from the mark keep their RescanInterval.
const completeLookDuty = 0.01

// completeLookSpacingMax bounds the spacing completeLookDuty asks for: a
// look's time counts its waits too (a lock queued behind an ALTER TABLE),
// which cost no CPU, and what only the complete look finds (rows without a
// dispatch_xid behind the mark, a quarantine lifted by a bare UPDATE) waits
// at most this long, or 60 rescan intervals when that is longer.
const completeLookSpacingMax = 30 * time.Minute

// lookFailed records a look that failed after cost: a complete one counts
// as done for its spacing, and, when there was no mark yet, the next looks
// start margin before now. Else a complete look that always fails (a
// statement_timeout shorter than a walk of the whole index) made every
// look a complete one, and the looks from the mark, which find a dead
// relay's expired leases, never ran again.
func (c *claimCursor) lookFailed(complete bool, start time.Time, cost, margin time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !complete {
		return
	}
	c.lastComplete, c.lastCompleteCost = start, cost
	if !c.low.avail.Valid {
		c.low = nextLowMark(nil, nil, start, margin)
	}
}

// lookDone records the low-water mark a look found, and when a complete one
// ran (at now, taking cost).
func (c *claimCursor) lookDone(low lowMark, complete bool, now time.Time, cost time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.low = low
	if complete {
		c.lastComplete, c.lastCompleteCost = now, cost
	}
}

// continueLanes records, for each lane of b whose claimed events were all
// published, its next sequence: the next claim looks for it. Another relay
// may have seen that event while its predecessor was leased here, and left
// it as not the head of its lane; nobody else would look for it again.
func (c *claimCursor) continueLanes(b batch, published []uuid.UUID) {
	if len(published) == 0 {
		return
	}
	done := make(map[uuid.UUID]struct{}, len(published))
	for _, id := range published {
		done[id] = struct{}{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, lane := range b.lanes {
		if len(lane) == 0 {
			continue
		}
		last := lane[len(lane)-1]
		if _, ok := done[last.ID]; !ok {
			continue
		}
		c.cont = append(c.cont, laneNext{typ: last.AggregateType, id: last.AggregateID, seq: last.Sequence + 1})
	}
}

// freshArgs are the incremental claim's arguments $5.. $10, and the lanes
// whose next event it looks for.
func (c *claimCursor) freshArgs() ([]any, []laneNext) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cont := c.cont
	c.cont = nil
	points := make([]string, len(c.points))
	for i, p := range c.points {
		points[i] = strconv.FormatUint(p, 10)
	}
	types, ids, seqs := laneArrays(cont)
	return []any{strconv.FormatUint(c.from.xid, 10), points, types, ids, seqs, c.from.id}, cont
}

// freshMeta is what an incremental claim reports besides its rows.
type freshMeta struct {
	snapshot  string  // pg_current_snapshot() of the claim statement
	fresh     int     // rows the range scan read (a full window: window)
	points    int     // rows the running transactions' lookup read
	headsCut  bool    // more heads were found than the batch could take
	lastRead  *string // the last position ("xid/event_id") the range scan read
	firstLeft *string // the lowest position of a head the range scan read and left (conservative: of any event it left, not leased here)
	keepLanes []int64 // 1-based positions in cont of lanes to look for again
	// keepPoints are the running transactions of the last snapshot that
	// now have events the claim read and left (not leased here): a
	// conservative cursor looks them up again.
	keepPoints []string
	// aheadLanes are the 1-based positions in cont of lanes whose next
	// event lies at or past the cursor's position (as written, not
	// quarantined), and aheadPos their positions ("xid/event_id"): the
	// range scan reads them there, and the cursor sets them aside
	// (claimCursor.ahead) instead of looking for them by key and locking
	// them at every claim.
	aheadLanes []int64
	aheadPos   []string
}

// advance moves the cursor after an incremental claim that read with window
// rows per scan.
//
// When neither scan filled its window and every head found was claimed,
// every event the claim's snapshot shows was read, and what was left is
// left to someone who will come back to it: the claim moves to the
// snapshot's xmax, and its running transactions become the points. Else it
// moves only up to the lowest position of a head it left for lack of
// room (a conservative cursor: of any event it left, not leased by this
// relay), and never past the last position the range scan read when
// that scan filled its window (what lies beyond was not read), and keeps
// its points, adding the transactions running below the new start. The
// events it read and left for other reasons may be passed, as when the
// window is not full: docs/design.md, "Why nothing is left behind". Were a
// lane's events behind its blocked head held too, a window of them would
// hold the cursor until the head moved, and no claim would read past them.
//
// It reports whether the range scan filled its window and the cursor moved
// to the last position it read: every event it read was passed, and more
// are committed past them, which the next claim reads (see batch.more).
func (c *claimCursor) advance(m freshMeta, window int, cont []laneNext) (more bool, err error) {
	_, xmax, xip, err := parseSnapshot(m.snapshot)
	if err != nil {
		return false, err
	}
	ahead := make([]laneAhead, 0, len(m.aheadLanes))
	for i, n := range m.aheadLanes {
		if n < 1 || int(n) > len(cont) || i >= len(m.aheadPos) {
			continue
		}
		pos, err := parseCursorPos(m.aheadPos[i])
		if err != nil {
			return false, err
		}
		ahead = append(ahead, laneAhead{laneNext: cont[n-1], pos: pos})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Whatever from becomes, the lanes set aside come back once it passes
	// them (docs/design.md, "Why nothing is left behind").
	c.ahead = append(c.ahead, ahead...)
	defer c.settleAhead(window)
	for _, n := range m.keepLanes {
		if n < 1 || int(n) > len(cont) {
			continue
		}
		l := cont[n-1]
		if !m.headsCut {
			// Not left for lack of room: a concurrent claim statement
			// holds it locked (it will lease it, and continue the lane
			// itself) or held it and let it go. A few looks, then it is
			// handed over (below).
			l.tries++
		}
		if l.tries < contRetries {
			// Left for lack of room (more heads than the batch takes) it is
			// looked for until it is claimed, leased or published: as
			// written it is not in the rescheduled index, and the range
			// scan passed it as not its lane's head, so nothing else would
			// find it before the full scan (found by TestInterleavings).
			c.cont = append(c.cont, l)
			continue
		}
		// Locked for contRetries claims in a row: by a statement that
		// holds its rows for long, such as a full scan under a pinned
		// xmin (seconds), which may leave it (its snapshot predates the
		// predecessor's mark). Dropped, it waited for the next full scan,
		// a minute and more under the pinned xmin (the pressure bench's
		// 34 s and 68 s events, TestLivenessContLockedByALongClaim). Made
		// due instead, the due scan finds it.
		c.over = append(c.over, l)
	}
	if len(c.cont) > contKeepFactor*window {
		// Each is a key lookup in every claim: under a long backlog of
		// heads, the oldest are kept and the rest are handed over to the
		// scheduled events before the next claim (handOff): made due now,
		// the due scan finds them, as it finds a stopped relay's lanes.
		c.over = append(c.over, c.cont[contKeepFactor*window:]...)
		c.cont = c.cont[:contKeepFactor*window]
	}
	full := m.fresh >= window || m.points >= window || m.headsCut
	if !full && !c.conservative {
		c.from, c.points = cursorPos{xid: xmax}, xip
		return false, nil
	}
	to := cursorPos{xid: xmax}
	if m.firstLeft != nil {
		v, err := parseCursorPos(*m.firstLeft)
		if err != nil {
			return false, err
		}
		if v.before(to) {
			to = v
		}
	}
	if m.fresh >= window && m.lastRead != nil {
		// The range scan stopped at its window: the events past the last
		// one it read were not read at all, whatever it did with those it
		// read. The last one itself stays in (the range starts at from,
		// inclusive). The place is an event's, not only its transaction's:
		// one transaction with more events than a window, none of them
		// claimable, held a cursor that was a transaction id at that
		// transaction for good (TestLivenessBulkWriteBehindUnparkedQuarantine).
		v, err := parseCursorPos(*m.lastRead)
		if err != nil {
			return false, err
		}
		if v.before(to) {
			to = v
		}
		// Every event it read was passed (none of them holds the cursor):
		// more are committed past them.
		more = to == v && c.from.before(to)
	}
	if to.before(c.from) {
		to = c.from
	}
	var points []uint64
	switch {
	case c.conservative && m.points < window:
		// Every point was read: keep those with events left, and add the
		// transactions running below the new start.
		for _, p := range m.keepPoints {
			v, err := strconv.ParseUint(p, 10, 64)
			if err != nil {
				return false, fmt.Errorf("claim cursor: %w", err)
			}
			points = append(points, v)
		}
		for _, x := range xip {
			if x < to.xid {
				points = append(points, x)
			}
		}
	default:
		// A running transaction is never from's or to's (their events
		// were read, or they are an xmax), so comparing ids is enough.
		points = c.points
		for _, x := range xip {
			if x >= c.from.xid && x < to.xid {
				points = append(points, x)
			}
		}
	}
	c.from, c.points = to, uniqueXIDs(points)
	return more, nil
}

// settleAhead puts the lanes set aside whose next event from has passed
// back into cont, to be looked for by key at the next claim: the range scan
// no longer reads where they lie. Their event may have been claimed and
// published since (the lookup then finds nothing), or read while another
// statement held it locked and passed. Beyond aheadKeepFactor windows, the
// lanes furthest ahead are handed over. c.mu is held.
func (c *claimCursor) settleAhead(window int) {
	c.ahead = slices.DeleteFunc(c.ahead, func(l laneAhead) bool {
		if l.pos.before(c.from) {
			c.cont = append(c.cont, l.laneNext)
			return true
		}
		return false
	})
	if limit := aheadKeepFactor * window; len(c.ahead) > limit {
		slices.SortFunc(c.ahead, func(a, b laneAhead) int { return a.pos.compare(b.pos) })
		for _, l := range c.ahead[limit:] {
			c.over = append(c.over, l.laneNext)
		}
		clear(c.ahead[limit:])
		c.ahead = c.ahead[:limit]
	}
}

// claimedLanes forgets the lanes set aside whose next event this relay
// has just claimed (b): it publishes them and continues those lanes
// itself. Without it each would be looked for once more, by key and
// under a lock, when the cursor passes it.
func (c *claimCursor) claimedLanes(b batch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ahead) == 0 || len(b.lanes) == 0 {
		return
	}
	// The claim returns a lane's rows in no particular order (orderLanes
	// sorts them later): each claimed sequence is looked up itself.
	type key struct {
		typ, id string
		seq     int64
	}
	claimed := make(map[key]struct{}, b.total)
	for _, lane := range b.lanes {
		for _, ev := range lane {
			claimed[key{ev.AggregateType, ev.AggregateID, ev.Sequence}] = struct{}{}
		}
	}
	c.ahead = slices.DeleteFunc(c.ahead, func(l laneAhead) bool {
		_, ok := claimed[key{l.typ, l.id, l.seq}]
		return ok
	})
}

// uniqueXIDs returns xs sorted, without repeats.
func uniqueXIDs(xs []uint64) []uint64 {
	slices.Sort(xs)
	return slices.Compact(xs)
}

// reset sets the cursor from a start-up query: from is the lowest
// dispatch_xid of a pending event that is neither quarantined nor parked (or
// the snapshot's xmax when there is none), and the points are the
// transactions running below it.
func (c *claimCursor) reset(lowest *string, snapshot string) error {
	_, xmax, xip, err := parseSnapshot(snapshot)
	if err != nil {
		return err
	}
	from := xmax
	if lowest != nil {
		v, err := strconv.ParseUint(*lowest, 10, 64)
		if err != nil {
			return fmt.Errorf("claim cursor: %w", err)
		}
		from = min(from, v)
	}
	var points []uint64
	for _, x := range xip {
		if x < from {
			points = append(points, x)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.from, c.points, c.valid = cursorPos{xid: from}, points, true
	return nil
}

// isValid reports whether the cursor has been set.
func (c *claimCursor) isValid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.valid
}

// parseSnapshot reads pg_snapshot's text form, "xmin:xmax:xip,xip,...".
func parseSnapshot(s string) (xmin, xmax uint64, xip []uint64, err error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return 0, 0, nil, fmt.Errorf("claim cursor: snapshot %q", s)
	}
	if xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return 0, 0, nil, fmt.Errorf("claim cursor: snapshot %q: %w", s, err)
	}
	if xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return 0, 0, nil, fmt.Errorf("claim cursor: snapshot %q: %w", s, err)
	}
	if parts[2] != "" {
		for _, f := range strings.Split(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return 0, 0, nil, fmt.Errorf("claim cursor: snapshot %q: %w", s, err)
			}
			xip = append(xip, x)
		}
	}
	return xmin, xmax, xip, nil
}

// cursorStartSQL is the start-up query of the claim cursor (see
// claimCursor.reset). It reads outbox_fresh_key_idx from its start, once.
func cursorStartSQL(events string) string {
	return `SELECT (SELECT min(e.dispatch_xid) FROM ` + events + ` e
	WHERE coalesce(e.published_at, e.quarantined_at) IS NULL AND e.dispatch_xid IS NOT NULL
	  AND e.available_at = e.occurred_at)::text,
	pg_current_snapshot()::text`
}

// startCursor sets r's claim cursor (see cursorStartSQL).
func (r *Relay) startCursor(ctx context.Context) error {
	var lowest *string
	var snap string
	if err := r.planned(r.pool).QueryRow(ctx, r.sql.cursorStart).Scan(&lowest, &snap); err != nil {
		return fmt.Errorf("claim cursor: %w", err)
	}
	return r.cursor.reset(lowest, snap)
}

// fastClaimSQL is the incremental claim: the claim of claimSQL, but with a
// window made only of
//
//   - fresh: the pending events as written (available_at = occurred_at) at
//     or past the cursor's position ($5, $10: dispatch_xid, event_id), a
//     range of outbox_fresh_key_idx,
//     oldest first, at most window of them;
//   - points: the pending events as written of the transactions that were
//     running at the cursor's snapshot ($6), looked up by dispatch_xid one
//     transaction at a time (outbox_fresh_key_idx). Written as a filter
//     (dispatch_xid = ANY ($6)), the generic plan the relay's prepared
//     statement keeps walked outbox_pending_lane_idx whole instead: under
//     a pinned xmin, every dead entry of it, 57 of a 68 ms claim (issue 24);
//   - due: the scheduled events (available_at <> occurred_at: backed off,
//     released, retried, unparked) that are due, not under a live lease
//     and the heads of their lanes (outbox_due_idx), oldest first,
//     at most window of them.
//     Only heads: a scheduled event behind an unpublished one cannot be
//     claimed, and released successors of a head that backs off would
//     otherwise fill the window before the heads due after them;
//   - cont: the next event of each lane the relay just published ($7-$9).
//
// The window's rows are locked and re-checked as in the full scan, the heads
// among them probed the same way (isHead) and their successors taken the
// same way (successorsSQL): what decides that an event may be claimed is
// unchanged, only where the claim looks for candidates. Nothing is searched
// past the window: the periodic full scan does that.
//
// Besides the claimed rows it returns one row (the first column true) with
// what the cursor needs: the statement's snapshot, how many rows each scan
// read, whether heads were left for lack of room, the last position the
// range scan read, the lowest position of a head it read and left
// for lack of room (for a conservative cursor, see claimCursor: of any event
// it read and did not claim, not counting events leased by this relay, which
// it will settle), and which looked-for lanes to look for again because
// their event was there but locked by another claim.
func fastClaimSQL(events string, batchSize int, heads string, conservative bool) string {
	limit, window := strconv.Itoa(batchSize), strconv.Itoa(claimWindow(batchSize))
	// firstLeft is the lowest position of a row of fresh, not claimed,
	// that keeps the cursor at or before it: a head left for lack of room.
	// The heads the range scan read are the rows of all_heads at or past
	// the cursor and as written (the other sources' rows are not: cont's
	// and points' lie before it, due's are scheduled). Written as the rows
	// of fresh that are IN all_heads, it was planned as a nested loop over
	// both, a thousand rows by a few hundred: a quarter of a drain's claim.
	firstLeft := `(SELECT f.dispatch_xid::text || '/' || f.event_id::text FROM all_heads f
	 WHERE f.event_id NOT IN (SELECT event_id FROM claimed)
	   AND f.available_at = f.occurred_at AND f.dispatch_xid IS NOT NULL
	   AND (f.dispatch_xid, f.event_id) >= ($5::text::xid8, $10::uuid)
	 ORDER BY f.dispatch_xid, f.event_id LIMIT 1)`
	if conservative {
		// Not a head when read: whoever publishes its predecessor looks
		// for it (cont; the CDC stream's waiting set), as for any cursor.
		firstLeft = `(SELECT f.dispatch_xid::text || '/' || f.event_id::text FROM fresh f
	 WHERE f.event_id NOT IN (SELECT event_id FROM claimed)
	   AND NOT (f.claimed_by IS NOT DISTINCT FROM $2 AND f.claim_until >= now())
	   AND ` + isHead(events, "f") + `
	 ORDER BY f.dispatch_xid, f.event_id LIMIT 1)`
	}
	headCond := isHead(events, "f")
	young, contYoung := "", ""
	if heads != "" { // a further condition on the heads, alias f (see reconcileHeadSQL)
		headCond += `
	  AND ` + heads
		// Rows that cannot be heads here are not locked: a safety net beside
		// a CDC stream reads the young events (its cursor must see them) but
		// locking them, even for the statement, made the stream's claim skip
		// them and its marks wait (issue 27).
		young = ` WHERE ` + heads
		contYoung = ` AND ` + heads
	}
	return `WITH fresh AS (
	SELECT e.event_id, e.dispatch_xid, e.claimed_by, e.claim_until, e.available_at, e.occurred_at,
		e.aggregate_type, e.aggregate_id, e.aggregate_sequence FROM ` + events + ` e
	WHERE coalesce(e.published_at, e.quarantined_at) IS NULL AND e.dispatch_xid IS NOT NULL
	  AND e.available_at = e.occurred_at
	  AND (e.dispatch_xid, e.event_id) >= ($5::text::xid8, $10::uuid)
	ORDER BY e.dispatch_xid, e.event_id
	LIMIT ` + window + `
), points AS (
	SELECT e.event_id, e.dispatch_xid, e.claimed_by, e.claim_until, e.available_at, e.occurred_at
	FROM unnest($6::text[]::xid8[]) AS x(xid)
	CROSS JOIN LATERAL (
		SELECT e.event_id, e.dispatch_xid, e.claimed_by, e.claim_until, e.available_at, e.occurred_at FROM ` + events + ` e
		WHERE coalesce(e.published_at, e.quarantined_at) IS NULL AND e.dispatch_xid IS NOT NULL
		  AND e.available_at = e.occurred_at
		  AND e.dispatch_xid = x.xid
		  AND ` + isHead(events, "e") + `
		LIMIT ` + window + `) e
	ORDER BY e.dispatch_xid
	LIMIT ` + window + `
), due AS (
	SELECT e.event_id, e.occurred_at FROM ` + events + ` e
	WHERE coalesce(e.published_at, e.quarantined_at) IS NULL
	  AND e.available_at <> e.occurred_at AND e.available_at < ` + parkedAvailableAt + `
	  AND e.available_at <= now()
	  AND (e.claim_until IS NULL OR e.claim_until < now())
	  AND ` + isHead(events, "e") + `
	ORDER BY e.available_at
	LIMIT ` + window + `
), cont AS (
	SELECT c.n, e.event_id, e.claim_until, e.quarantined_at, e.occurred_at, e.dispatch_xid,
		NOT (e.quarantined_at IS NULL AND e.dispatch_xid IS NOT NULL AND e.available_at = e.occurred_at
		     AND (e.dispatch_xid, e.event_id) >= ($5::text::xid8, $10::uuid)) AS behind
	FROM unnest($7::text[], $8::text[], $9::bigint[]) WITH ORDINALITY AS c(t, i, s, n)
	CROSS JOIN LATERAL (
		SELECT e.event_id, e.claim_until, e.quarantined_at, e.published_at, e.occurred_at, e.available_at, e.dispatch_xid FROM ` + events + ` e
		WHERE e.aggregate_type = c.t AND e.aggregate_id = c.i AND e.aggregate_sequence = c.s
		OFFSET 0) e
	WHERE e.published_at IS NULL
), scan AS (
	SELECT e.event_id, e.claimed_by, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.available_at, e.occurred_at, e.dispatch_xid
	FROM (SELECT f.event_id FROM fresh f` + young + ` UNION SELECT f.event_id FROM points f` + young + `
		UNION SELECT f.event_id FROM due f` + young + ` UNION SELECT f.event_id FROM cont f WHERE f.behind` + contYoung + `) i
	CROSS JOIN LATERAL (
		SELECT * FROM ` + events + ` e WHERE e.event_id = i.event_id OFFSET 0 FOR UPDATE SKIP LOCKED) e
	WHERE ` + claimableNow("e") + `
), all_heads AS (
	SELECT f.event_id, f.claimed_by, f.aggregate_type, f.aggregate_id, f.aggregate_sequence, f.available_at, f.occurred_at, f.dispatch_xid FROM (
		SELECT DISTINCT ON (w.aggregate_type COLLATE "C", w.aggregate_id COLLATE "C") w.* FROM scan w
		ORDER BY w.aggregate_type COLLATE "C", w.aggregate_id COLLATE "C", w.aggregate_sequence) f
	WHERE ` + headCond + `
), heads AS (
	SELECT h.event_id, h.claimed_by, h.aggregate_type, h.aggregate_id, h.aggregate_sequence FROM all_heads h
	ORDER BY h.available_at, h.occurred_at, h.dispatch_xid, h.event_id
	LIMIT ` + limit + `
), ` + successorsSQL(events) + `
), candidates AS (
	SELECT event_id, claimed_by, true AS head FROM heads
	UNION ALL
	SELECT event_id, claimed_by, false FROM runs
), claimed (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version,
	content_type, payload, headers, occurred_at, skipped_from, attempt_count, prev_owner) AS (
	UPDATE ` + events + ` e
	SET claimed_by = $2, claim_token = $3, claim_until = now() + $4 * interval '1 millisecond'
	FROM candidates c
	WHERE e.event_id = c.event_id
	  AND e.event_id = ANY (ARRAY(SELECT event_id FROM candidates))
	RETURNING ` + messageColumnsSkipped(events, "e", `CASE WHEN c.head THEN `+skippedFromSQL(events, "e")+` ELSE 0 END`) + `, e.attempt_count, c.claimed_by
)
SELECT false, c.*, NULL::text, 0::bigint, 0::bigint, false, NULL::text, NULL::text, NULL::bigint[], NULL::text[], NULL::bigint[], NULL::text[] FROM claimed c
UNION ALL
SELECT true, '00000000-0000-0000-0000-000000000000'::uuid, '', '', 0::bigint, '', 0, '', ''::bytea, '{}', now(), 0::bigint, 0, NULL::text,
	pg_current_snapshot()::text,
	(SELECT count(*) FROM fresh),
	(SELECT count(*) FROM points),
	(SELECT count(*) FROM all_heads) > ` + limit + `,
	(SELECT f.dispatch_xid::text || '/' || f.event_id::text FROM fresh f
	 ORDER BY f.dispatch_xid DESC, f.event_id DESC LIMIT 1),
	` + firstLeft + `,
	ARRAY(SELECT c.n FROM cont c
	 WHERE c.behind AND c.event_id NOT IN (SELECT event_id FROM claimed)
	   AND c.quarantined_at IS NULL AND (c.claim_until IS NULL OR c.claim_until < now())),
	ARRAY(SELECT DISTINCT p.dispatch_xid::text FROM points p
	 WHERE p.event_id NOT IN (SELECT event_id FROM claimed)
	   AND NOT (p.claimed_by IS NOT DISTINCT FROM $2 AND p.claim_until >= now())),
	ARRAY(SELECT c.n FROM cont c WHERE NOT c.behind ORDER BY c.n),
	ARRAY(SELECT c.dispatch_xid::text || '/' || c.event_id::text FROM cont c WHERE NOT c.behind ORDER BY c.n)`
}

// claimKind decides how the claim starting at now looks for events (see
// claimCursor.nextKind).
func (r *Relay) claimKind(now time.Time) claimKind {
	return r.cursor.nextKind(now, r.rescanInterval())
}

// claimFresh runs the incremental claim into b and moves the cursor.
func (r *Relay) claimFresh(ctx context.Context, q querier, b *batch) (int64, error) {
	if !r.cursor.isValid() {
		if err := r.startCursor(ctx); err != nil {
			return 0, err
		}
	}
	if err := r.handOffOverflow(ctx, q); err != nil {
		return 0, err
	}
	args, cont := r.cursor.freshArgs()
	rows, err := q.Query(ctx, r.sql.fastClaim, append([]any{r.cfg.BatchSize, r.cfg.ID, b.token, r.cfg.LeaseDuration.Milliseconds()}, args...)...)
	if err != nil {
		r.cursor.restore(cont)
		return 0, fmt.Errorf("claim batch: %w", err)
	}
	defer rows.Close()
	var l laneBuilder
	var meta freshMeta
	seen := false
	for rows.Next() {
		var isMeta bool
		var row messageRow
		var attempts int
		var prevOwner, snap *string
		var fresh, points int64
		var headsCut bool
		dest := append([]any{&isMeta}, row.dest(&attempts, &prevOwner)...)
		dest = append(dest, &snap, &fresh, &points, &headsCut, &meta.lastRead, &meta.firstLeft, &meta.keepLanes, &meta.keepPoints,
			&meta.aheadLanes, &meta.aheadPos)
		if err := rows.Scan(dest...); err != nil {
			r.cursor.restore(cont)
			return l.takenOver, fmt.Errorf("claim batch: %w", err)
		}
		if isMeta {
			seen = true
			meta.snapshot, meta.fresh, meta.points, meta.headsCut = *snap, int(fresh), int(points), headsCut
			continue
		}
		l.add(b, row, attempts, prevOwner)
	}
	if err := rows.Err(); err != nil {
		r.cursor.restore(cont)
		return l.takenOver, fmt.Errorf("claim batch: %w", err)
	}
	if !seen {
		r.cursor.restore(cont)
		return l.takenOver, errors.New("claim batch: the incremental claim returned no cursor row")
	}
	more, err := r.cursor.advance(meta, claimWindow(r.cfg.BatchSize), cont)
	if err != nil {
		return l.takenOver, err
	}
	b.more = more
	return l.takenOver, nil
}

// restore puts back the looked-for lanes of a claim that failed.
func (c *claimCursor) restore(cont []laneNext) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cont = append(cont, c.cont...)
}

// handOffOverflow makes due the next events of the lanes the cursor had no
// room to keep looking for (claimCursor.over), before a claim: its due scan
// finds them. On error they are kept for the next claim.
func (r *Relay) handOffOverflow(ctx context.Context, q querier) error {
	r.cursor.mu.Lock()
	over := r.cursor.over
	r.cursor.over = nil
	r.cursor.mu.Unlock()
	if len(over) == 0 {
		return nil
	}
	types, ids, seqs := laneArrays(over)
	rows, err := q.Query(ctx, r.sql.handOffSkip, types, ids, seqs)
	var locked []laneNext
	if err == nil {
		for rows.Next() {
			var l laneNext
			if err = rows.Scan(&l.typ, &l.id, &l.seq); err != nil {
				break
			}
			locked = append(locked, l)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		r.cursor.mu.Lock()
		r.cursor.over = append(over, r.cursor.over...)
		r.cursor.mu.Unlock()
		return fmt.Errorf("claim batch: hand lanes over: %w", err)
	}
	if len(locked) > 0 {
		r.cursor.mu.Lock()
		r.cursor.over = append(locked, r.cursor.over...)
		r.cursor.mu.Unlock()
	}
	return nil
}

// laneArrays is lanes as the arrays the statements take: aggregate types,
// ids and sequences.
func laneArrays(lanes []laneNext) (types, ids []string, seqs []int64) {
	types, ids, seqs = make([]string, len(lanes)), make([]string, len(lanes)), make([]int64, len(lanes))
	for i, l := range lanes {
		types[i], ids[i], seqs[i] = l.typ, l.id, l.seq
	}
	return types, ids, seqs
}

// handOffLanes is a stopping relay's last write: the next events of the
// lanes it published up to (cont), which only it would have looked for,
// are made due now, so that any other relay's incremental claim finds them
// among the scheduled events. Another relay may have read such an event
// while its predecessor was leased here, and passed it as not the head of
// its lane. A relay that dies instead leaves them to the other relays'
// full scans (RescanInterval).
func (r *Relay) handOffLanes(ctx context.Context) {
	r.cursor.mu.Lock()
	cont := append(r.cursor.cont, r.cursor.over...)
	for _, l := range r.cursor.ahead {
		cont = append(cont, l.laneNext)
	}
	r.cursor.cont, r.cursor.over, r.cursor.ahead = nil, nil, nil
	from, valid, conservative := r.cursor.from, r.cursor.valid, r.cursor.conservative
	r.cursor.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ShutdownTimeout)
	defer cancel()
	if valid && !conservative {
		// The heads this relay's cursor was holding (left for lack of
		// room): another relay's claim may have read them while this
		// relay's statement held them locked, and passed them; only this
		// cursor would have come back to them. They are in the window that
		// starts at the cursor (TestLivenessAdv34StoppedRelayLeavesTheHeadsItHadNoRoomFor).
		if _, err := r.planned(r.pool).Exec(ctx, r.sql.handOffWindow, strconv.FormatUint(from.xid, 10), from.id); err != nil {
			r.log.Warn("could not hand the heads its claim cursor held over to the other relays; their full scans will find them",
				slog.Any("error", err))
		}
	}
	if len(cont) == 0 {
		return
	}
	types, ids, seqs := laneArrays(cont)
	// Skipping locked rows: a plain update waited for an application's
	// row lock until ShutdownTimeout, and was then cancelled whole
	// (TestLivenessStopWithALockedLaneInOver).
	rows, err := r.planned(r.pool).Query(ctx, r.sql.handOffSkip, types, ids, seqs)
	locked := 0
	if err == nil {
		for rows.Next() {
			locked++
		}
		rows.Close()
		err = rows.Err()
	}
	switch {
	case err != nil:
		r.log.Warn("could not hand the lanes it published up to over to the other relays; their full scans will find the next events",
			slog.Int("lanes", len(cont)), slog.Any("error", err))
	case locked > 0:
		r.log.Warn("some lanes it published up to were locked by another transaction and not handed over; the other relays' full scans will find their next events",
			slog.Int("lanes", locked))
	}
}

// handOffSkipSQL makes due now the events ($1, $2, $3: aggregate types, ids
// and sequences) that are pending and as written (handOffOverflow,
// handOffLanes). It waits for no row lock, and returns the lanes whose event it left because
// another statement held it, still pending and as written, to be handed
// over at the next claim. (Its last SELECT reads the statement's snapshot,
// taken before the update: moved rows look as written there, hence NOT IN.)
//
// Each lane's event is found by its key alone, in a subquery of its own
// (OFFSET 0), and the other conditions are checked outside it: written as a
// join of the lanes with the pending events, PostgreSQL planned it as a
// scan of outbox_dispatch_idx, every pending event and, under a pinned
// xmin, every dead entry, with the lanes as a filter: 10 to 20 s a
// statement in the pressure bench, holding the locks it had taken
// (TestHandOffPlannedByKey).
func handOffSkipSQL(events string) string {
	return `WITH l AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS l(aggregate_type, aggregate_id, aggregate_sequence)
), target AS (
	SELECT e.event_id FROM l CROSS JOIN LATERAL (
		SELECT e.event_id, e.published_at, e.quarantined_at, e.available_at, e.occurred_at FROM ` + events + ` e
		WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
		  AND e.aggregate_sequence = l.aggregate_sequence
		OFFSET 0 FOR UPDATE OF e SKIP LOCKED) e
	WHERE e.published_at IS NULL AND e.quarantined_at IS NULL AND e.available_at = e.occurred_at
), moved AS (
	UPDATE ` + events + ` e SET available_at = ` + dueAgainSQL() + `
	FROM target t WHERE e.event_id = t.event_id
	  AND e.event_id = ANY (ARRAY(SELECT event_id FROM target))
	RETURNING e.event_id
)
SELECT l.aggregate_type, l.aggregate_id, l.aggregate_sequence FROM l CROSS JOIN LATERAL (
	SELECT e.event_id, e.published_at, e.quarantined_at, e.available_at, e.occurred_at FROM ` + events + ` e
	WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
	  AND e.aggregate_sequence = l.aggregate_sequence
	OFFSET 0) e
WHERE e.published_at IS NULL AND e.quarantined_at IS NULL AND e.available_at = e.occurred_at
  AND e.event_id NOT IN (SELECT event_id FROM moved)`
}

// handOffWindowSQL makes due now the heads among the first window of
// pending events as written at or past a cursor position ($1, $2: a
// dispatch_xid and an event id), not under a live lease, skipping locked
// rows: a stopping relay's hand-over of what its cursor held (see
// Relay.handOffLanes). A relay's claim keeps its cursor before a head it
// left for lack of room, and such a head is in the window its range scan
// reads from there.
func handOffWindowSQL(events string, batchSize int) string {
	return `WITH w AS (
	SELECT e.event_id FROM ` + events + ` e
	WHERE coalesce(e.published_at, e.quarantined_at) IS NULL AND e.dispatch_xid IS NOT NULL
	  AND e.available_at = e.occurred_at
	  AND (e.dispatch_xid, e.event_id) >= ($1::text::xid8, $2::uuid)
	ORDER BY e.dispatch_xid, e.event_id
	LIMIT ` + strconv.Itoa(claimWindow(batchSize)) + `
), target AS (
	SELECT e.event_id FROM w CROSS JOIN LATERAL (
		SELECT * FROM ` + events + ` e WHERE e.event_id = w.event_id OFFSET 0 FOR UPDATE SKIP LOCKED) e
	WHERE e.published_at IS NULL AND e.quarantined_at IS NULL AND e.available_at = e.occurred_at
	  AND (e.claim_until IS NULL OR e.claim_until < now())
	  AND ` + isHead(events, "e") + `
)
UPDATE ` + events + ` e SET available_at = ` + dueAgainSQL() + `
FROM target t WHERE e.event_id = t.event_id
  AND e.event_id = ANY (ARRAY(SELECT event_id FROM target))`
}
