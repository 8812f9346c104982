package outbox

import "github.com/pgoutbox/outbox/internal/pgident"

// relaySQL holds the relay's statements for one schema.
type relaySQL struct {
	claim, markPublished, markFailed, release string
}

func newRelaySQL(s pgident.Schema) relaySQL {
	events := s.Table("outbox_events")
	return relaySQL{
		// One statement, so one short transaction. A row is claimable when it
		// is unpublished, not quarantined, due, not under a live lease, and the
		// head of its aggregate's lane. SKIP LOCKED lets relays claim side by
		// side; the lease condition is re-checked on the newest row version, and
		// a stale snapshot of the lane check can only exclude more rows, since
		// an event never goes from published back to unpublished.
		claim: `WITH candidates AS (
	SELECT e.event_id, e.claimed_by FROM ` + events + ` e
	WHERE e.published_at IS NULL
	  AND e.quarantined_at IS NULL
	  AND e.available_at <= now()
	  AND (e.claim_until IS NULL OR e.claim_until < now())
	  AND NOT EXISTS (
		SELECT 1 FROM ` + events + ` p
		WHERE p.published_at IS NULL
		  AND p.aggregate_type = e.aggregate_type
		  AND p.aggregate_id = e.aggregate_id
		  AND p.aggregate_sequence < e.aggregate_sequence)
	ORDER BY e.available_at, e.occurred_at
	LIMIT $1
	FOR UPDATE OF e SKIP LOCKED
)
UPDATE ` + events + ` e
SET claimed_by = $2, claim_token = $3, claim_until = now() + $4 * interval '1 millisecond'
FROM candidates c
WHERE e.event_id = c.event_id
RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type,
	e.schema_version, e.payload, e.headers, e.occurred_at, e.attempt_count, c.claimed_by`,

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

		release: `UPDATE ` + events + `
SET claimed_by = NULL, claim_token = NULL, claim_until = NULL
WHERE event_id = ANY($1) AND claim_token = $2`,
	}
}
