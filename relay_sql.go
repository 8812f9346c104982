package outbox

import (
	"strconv"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// relaySQL holds the relay's statements for one schema.
type relaySQL struct {
	claim, markPublished, markFailed, release string
	// claimIDs claims given events for PublishIDs; missingIDs finds those
	// of them that have no row.
	claimIDs, missingIDs string
	// flagLanes and parkLanes park the lanes of quarantined events whose
	// counter rows are free (see parkSQL).
	flagLanes, parkLanes string
	// fastClaim is the incremental claim and cursorStart its cursor's
	// start-up query (relay_cursor.go).
	fastClaim, cursorStart string
	// probeRoutes probes the routes the destination refuses (see
	// probeRoutesSQL).
	probeRoutes string
	// handOffSkip makes the next events of lanes due again, leaving
	// and returning the locked ones (see Relay.handOffOverflow and
	// Relay.handOffLanes).
	handOffSkip string
	// handOffWindow makes due the heads a stopping relay's cursor held
	// (see handOffWindowSQL).
	handOffWindow string
	// releaseToken releases every event leased under a claim token ($1):
	// the rows of a claim whose answer was lost (see Relay.dropFullScan).
	releaseToken string
	// look and claimLooked are the background full scan's two statements
	// (relay_fullscan.go): where to look, without a lock, then the claim
	// of what it found.
	look, claimLooked string
}

// newRelaySQL builds the statements for schema s and a relay claiming up to
// batchSize events. The batch size is written into the claim as a literal
// (the statement still takes it as $1, for the room left for successors):
// PostgreSQL then plans the claim once per connection and reuses the plan,
// where a LIMIT $1 makes it re-plan the statement on every execution.
func newRelaySQL(s pgident.Schema, batchSize int) relaySQL {
	events := s.Table("outbox_events")
	flagLanes, parkLanes := parkSQL(s)
	return relaySQL{
		flagLanes: flagLanes, parkLanes: parkLanes,
		claim: claimSQL(events, batchSize, ""),
		look:  lookSQL(events, batchSize, ""), claimLooked: claimLookedSQL(events, batchSize, ""),
		fastClaim: fastClaimSQL(events, batchSize, "", false), cursorStart: cursorStartSQL(events),
		// claimIDs is PublishIDs's claim (see claimIDsSQL).
		claimIDs: claimIDsSQL(events), missingIDs: missingIDsSQL(events),
		probeRoutes: probeRoutesSQL(events), handOffSkip: handOffSkipSQL(events),
		handOffWindow: handOffWindowSQL(events, batchSize),

		// Every write-back is fenced by the claim token: a relay whose lease
		// expired and was taken over changes nothing.
		markPublished: `UPDATE ` + events + `
SET published_at = now(), claimed_by = NULL, claim_token = NULL, claim_until = NULL
WHERE event_id = ANY($1) AND claim_token = $2`,

		markFailed: `UPDATE ` + events + ` e
SET available_at = now() + f.delay_ms * interval '1 millisecond',
	attempt_count = e.attempt_count + f.attempts,
	last_error = f.error,
	quarantined_at = CASE WHEN f.quarantine THEN now() END,
	claimed_by = NULL, claim_token = NULL, claim_until = NULL
FROM unnest($1::uuid[], $2::bigint[], $3::int[], $4::text[], $5::bool[])
	AS f(event_id, delay_ms, attempts, error, quarantine)
WHERE e.event_id = f.event_id AND e.claim_token = $6`,

		// A released event is due again at once; its available_at is no
		// longer its occurred_at, so it is in outbox_due_idx, where an
		// incremental claim finds it (relay_cursor.go): its dispatch_xid may
		// be behind every relay's cursor.
		release: `UPDATE ` + events + `
SET claimed_by = NULL, claim_token = NULL, claim_until = NULL,
	available_at = ` + dueAgainSQL() + `
WHERE event_id = ANY($1) AND claim_token = $2`,
		releaseToken: `UPDATE ` + events + `
SET claimed_by = NULL, claim_token = NULL, claim_until = NULL,
	available_at = ` + dueAgainSQL() + `
WHERE published_at IS NULL AND claim_token = $1`,
	}
}

// dueAgainSQL is the available_at of an event made due again now (released,
// retried, unparked, held route back, the next event of a skipped head):
// the moment of the statement. It is not the event's occurred_at (the
// writer's transaction start, long before), so the event counts as
// scheduled (available_at <> occurred_at) and is in outbox_due_idx
// (migration 009), where an incremental claim looks for events whose
// transaction is behind its cursor. It is only now, never pushed to follow
// occurred_at: an occurred_at ahead of the database's clock (set by a
// writer from its own) must not delay the event.
func dueAgainSQL() string { return `clock_timestamp()` }

// claimSQL is the polling claim. heads, when not empty, is a further
// condition on the heads (alias e), ANDed to claimable (see reconcileHeadSQL).
//
// One statement, so one short transaction. A row is claimable when it
// is unpublished, not quarantined, due, not under a live lease, and the
// head of its aggregate's lane. SKIP LOCKED lets relays claim side by
// side; the lease condition is re-checked on the newest row version, and
// a stale snapshot of the lane check can only exclude more rows, since
// an event never goes from published back to unpublished. A skipped
// event counts as published (published_at is set at the skip); the last
// column probes the event just before (unique index) for a skip.
// The heads are followed by their lanes' contiguous successors when
// they leave room in the batch (see successorsSQL).
// The second condition on event_id changes nothing but the plan: it
// makes the UPDATE find its rows through the primary key, where a
// join estimated at batchSize rows may be planned as a hash join over
// a sequential scan of the table.
func claimSQL(events string, batchSize int, heads string) string {
	return `WITH ` + headsSQL(events, batchSize, heads) + `
), ` + claimHeadsSQL(events)
}

// claimHeadsSQL ends a claim statement after its heads CTE: the heads'
// successors (successorsSQL), and the UPDATE that leases them all,
// returning the claim's columns.
func claimHeadsSQL(events string) string {
	return successorsSQL(events) + `
), candidates AS (
	SELECT event_id, claimed_by, true AS head FROM heads
	UNION ALL
	SELECT event_id, claimed_by, false FROM runs
)
UPDATE ` + events + ` e
SET claimed_by = $2, claim_token = $3, claim_until = now() + $4 * interval '1 millisecond'
FROM candidates c
WHERE e.event_id = c.event_id
  AND e.event_id = ANY (ARRAY(SELECT event_id FROM candidates))
RETURNING ` + messageColumnsSkipped(events, "e", `CASE WHEN c.head THEN `+skippedFromSQL(events, "e")+` ELSE 0 END`) + `, e.attempt_count, c.claimed_by`
}

// messageColumns lists, for event alias e, the columns a Message is read
// from (see messageRow): the payload as written (payload_bytes, or the text
// of a jsonb payload inserted by hand or before migration 003), the content
// type (NULL is JSON), the headers as raw JSON, decoded in Go so that a row
// whose headers are not a string map fails alone instead of the whole query.
func messageColumns(events, e string) string {
	return messageColumnsSkipped(events, e, skippedFromSQL(events, e))
}

// messageColumnsSkipped is messageColumns with skipped as the SkippedFrom
// expression. The claim probes for a skip only at the heads: a claimed
// successor's predecessor is claimed with it, so it was not skipped.
func messageColumnsSkipped(events, e, skipped string) string {
	return e + `.event_id, ` + e + `.aggregate_type, ` + e + `.aggregate_id, ` + e + `.aggregate_sequence, ` + e + `.event_type,
	` + e + `.schema_version, coalesce(` + e + `.content_type, '` + ContentTypeJSON + `'),
	coalesce(` + e + `.payload_bytes, convert_to(` + e + `.payload::text, 'UTF8')), ` + e + `.headers::text, ` + e + `.occurred_at,
	` + skipped
}

// skippedFromSQL is the expression giving the SkippedFrom of event alias e:
// the skipped_from of the aggregate's previous event when that one was
// skipped, else 0. One probe of the unique index per row returned.
func skippedFromSQL(events, e string) string {
	return `coalesce((SELECT s.skipped_from FROM ` + events + ` s
		WHERE s.aggregate_type = ` + e + `.aggregate_type AND s.aggregate_id = ` + e + `.aggregate_id
		  AND s.aggregate_sequence = ` + e + `.aggregate_sequence - 1 AND s.skipped_at IS NOT NULL), 0)`
}

// successorsSQL continues the claim statement after its heads CTE: the room
// left in the batch is shared among the claimed heads' lanes, and each lane
// gets its contiguous successors (head+1, head+2, ...), each locked (SKIP
// LOCKED) and re-checked on its newest version like a head: unpublished, not
// quarantined, due, not under a live lease. A lane's run stops at the first
// sequence that is missing from the locked rows (locked elsewhere, backed
// off, quarantined, leased, not committed yet), so a relay never holds k+2
// without k+1. When the heads fill the batch nothing is probed.
//
// As in isHead, the lookup states the lane's key range alone, in a subquery
// of its own (OFFSET 0) that locks the rows, and the claimable conditions
// are checked outside it on the locked (newest) versions: stated inside,
// they let PostgreSQL walk outbox_dispatch_idx for each head (its
// available_at <= now() as the index condition, the lane as a filter),
// which it did under a pinned xmin in the pressure bench. The range's rows
// that are not claimable are locked for the statement too; they are the
// lane's own, which no other claim takes while its head is held here.
func successorsSQL(events string) string {
	return `budget AS (
	SELECT $1 - count(*) AS room, ($1 - count(*) + greatest(count(*), 1) - 1) / greatest(count(*), 1) AS per_lane FROM heads
), successors AS (
	SELECT s.event_id, s.claimed_by, s.aggregate_sequence - h.aggregate_sequence AS k,
		h.aggregate_type, h.aggregate_id
	FROM heads h
	CROSS JOIN LATERAL (
		SELECT s.event_id, s.claimed_by, s.aggregate_sequence, s.published_at, s.quarantined_at,
			s.available_at, s.claim_until FROM ` + events + ` s
		WHERE s.aggregate_type = h.aggregate_type
		  AND s.aggregate_id = h.aggregate_id
		  AND s.aggregate_sequence > h.aggregate_sequence
		  AND s.aggregate_sequence <= h.aggregate_sequence + (SELECT per_lane FROM budget)
		OFFSET 0 FOR UPDATE OF s SKIP LOCKED) s
	WHERE (SELECT room FROM budget) > 0
	  AND s.published_at IS NULL
	  AND s.quarantined_at IS NULL
	  AND s.available_at <= now()
	  AND (s.claim_until IS NULL OR s.claim_until < now())
), runs AS (
	SELECT r.event_id, r.claimed_by FROM (
		SELECT s.event_id, s.claimed_by, s.k,
			row_number() OVER (PARTITION BY s.aggregate_type, s.aggregate_id ORDER BY s.k) AS rn
		FROM successors s) r
	WHERE r.k = r.rn
	ORDER BY r.rn
	LIMIT (SELECT room FROM budget)`
}

// claimable is the condition on an event row (alias e) for a relay to claim
// it, apart from being the head of its lane or a head's successor.
func claimable(e string) string {
	return e + `.published_at IS NULL
	  AND ` + e + `.quarantined_at IS NULL
	  AND ` + e + `.available_at <= now()
	  AND (` + e + `.claim_until IS NULL OR ` + e + `.claim_until < now())`
}

// claimableNow is claimable for a row the claim found by its transaction
// (the incremental claim's fresh events, PublishIDs's ids): an event as
// written (available_at = occurred_at exactly, the writer's transaction
// start) is due as soon as it is visible. Comparing its available_at with the
// claim's now() is wrong there: now() is the claim's transaction start,
// taken before its snapshot, so an event whose writer started after the
// claim's now() and committed before its snapshot is visible but looks
// not yet due, and the claim would leave it (the incremental claim's cursor
// would pass it; PublishIDs would leave it to the safety net).
func claimableNow(e string) string {
	return e + `.published_at IS NULL
	  AND ` + e + `.quarantined_at IS NULL
	  AND (` + e + `.available_at <= now() OR ` + e + `.available_at = ` + e + `.occurred_at)
	  AND (` + e + `.claim_until IS NULL OR ` + e + `.claim_until < now())`
}

// isHead is the condition that e is the head of its aggregate's lane: its
// predecessor (aggregate_sequence - 1) is published (or skipped, or cleaned
// up after publication, or e is the first event). That is the same as "no
// earlier event of the aggregate is unpublished", because an aggregate's
// published events always form a prefix of its sequences: the writer hands
// out gap-free sequences that commit in order, the relay publishes k+1 only
// after k, and clean-up deletes only published events. Probing the
// predecessor alone is one key lookup, however many of the lane's events
// were published since the last VACUUM (their dead index entries would
// otherwise be walked by every probe). OFFSET 0 keeps PostgreSQL from
// turning the NOT EXISTS into an anti-join, which it may plan as a hash join
// over every pending row.
//
// The lookup states the key alone, in a subquery of its own (OFFSET 0), and
// "unpublished" is checked outside it: the unique index of the key is then
// the only index that can serve it. Stated beside the key, published_at IS
// NULL let every partial index of pending events serve the probe, and on
// statistics taken while the table was young the generic plan walked
// outbox_dispatch_idx whole for each probe, with the key as a filter: under
// a pinned xmin, every dead entry, 16 million buffers and 77 s for one
// claim in the pressure bench (TestClaimPlannedUnderAPinnedXmin).
func isHead(events, e string) string { return isHeadExcept(events, e, "") }

// isHeadExcept is isHead with a predecessor that meets the extra condition
// on p (when not empty) counted as published.
func isHeadExcept(events, e, except string) string {
	cond := ""
	if except != "" {
		cond = `
		  AND NOT (` + except + `)`
	}
	return `NOT EXISTS (
		SELECT 1 FROM (
			SELECT p.event_id, p.published_at FROM ` + events + ` p
			WHERE p.aggregate_type = ` + e + `.aggregate_type
			  AND p.aggregate_id = ` + e + `.aggregate_id
			  AND p.aggregate_sequence = ` + e + `.aggregate_sequence - 1
			OFFSET 0) p
		WHERE p.published_at IS NULL` + cond + `
		OFFSET 0)`
}

// headsSQL starts the claim statement: the heads CTE holds up to batchSize
// heads of lanes, oldest first, locked and re-checked on their newest row
// version.
//
// The claim locks (SKIP LOCKED) the oldest claimable events, a window of
// 1.25×batchSize of them, and takes the heads among them. Locking the whole
// window makes concurrent relays take disjoint windows (each skips the
// rows another one is claiming), and bounds the work of a claim when few
// lanes hold many events: only the first row of each lane in the window
// (its lowest sequence: a lane's head, when it is in the window, is its
// lowest unpublished sequence) is probed, once, and the rest of the
// lanes' events are not read. Rows of lanes held up elsewhere
// (by a quarantined, backed-off or leased event, or another relay's claim)
// only leave fewer heads in the window. Only when the window holds no head
// at all does the claim scan past it, as far as it takes to find batchSize
// heads: a blocked lane never starves the others. The window's locks last
// as long as the claim statement.
func headsSQL(events string, batchSize int, extra string) string {
	limit, window := strconv.Itoa(batchSize), strconv.Itoa(batchSize+batchSize/4)
	cond := windowCond(extra)
	return `scan AS (
	SELECT e.event_id, e.claimed_by, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.available_at, e.occurred_at
	FROM ` + events + ` e
	WHERE ` + cond + `
	ORDER BY e.available_at, e.occurred_at
	LIMIT ` + window + `
	FOR UPDATE OF e SKIP LOCKED
), scan_heads AS (` + windowHeadsSQL(events, limit) + `
), blocked AS (
	SELECT NOT EXISTS (SELECT 1 FROM scan_heads) AND EXISTS (SELECT 1 FROM scan) AS beyond
), beyond AS (
	SELECT e.event_id, e.claimed_by, e.aggregate_type, e.aggregate_id, e.aggregate_sequence FROM ` + events + ` e
	WHERE (SELECT beyond FROM blocked)
	  AND ` + cond + `
	  AND ` + isHead(events, "e") + `
	ORDER BY e.available_at, e.occurred_at
	LIMIT ` + limit + `
	FOR UPDATE OF e SKIP LOCKED
), heads AS (
	SELECT * FROM scan_heads WHERE NOT (SELECT beyond FROM blocked)
	UNION ALL
	SELECT * FROM beyond`
}

// windowHeadsSQL is the body of the scan_heads CTE of a claim whose window
// is the CTE scan: the first row of each lane in the window, when it is the
// head of its lane (isHead), oldest first, at most limit of them.
func windowHeadsSQL(events, limit string) string {
	return `
	SELECT f.event_id, f.claimed_by, f.aggregate_type, f.aggregate_id, f.aggregate_sequence FROM (
		SELECT DISTINCT ON (w.aggregate_type COLLATE "C", w.aggregate_id COLLATE "C") w.* FROM scan w
		ORDER BY w.aggregate_type COLLATE "C", w.aggregate_id COLLATE "C", w.aggregate_sequence) f
	WHERE ` + isHead(events, "f") + `
	ORDER BY f.available_at, f.occurred_at
	LIMIT ` + limit
}

// windowCond is the condition on a row e of the full scan's window: it is
// claimable, and meets extra (a further condition on e, or empty).
func windowCond(extra string) string {
	cond := claimable("e")
	if extra != "" {
		cond += `
	  AND ` + extra
	}
	return cond
}
