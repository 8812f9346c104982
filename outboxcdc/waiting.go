package outboxcdc

// The state of the events a PublishIDs call found and did not publish:
// whether the stream keeps them and hands them over again (the waiting set),
// or is done with them.
//
// PublishIDs reports which ids it published and which it did not find; this
// one query, made only after a call that left some found ids, says what
// became of the others. It reads the table's own record of publication
// (published_at), so it must follow any change to how PublishIDs records
// publication.

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// stateKind is what the stream does with an id a call did not publish.
type stateKind int

const (
	// stateDone: published (by another relay, or before: the stream reads
	// transactions again after a restart), or deleted since (clean-up
	// deletes published events only).
	stateDone stateKind = iota + 1
	// stateParked: quarantined, or behind a quarantined event (parked):
	// it waits for an operator, and the stream leaves it to the table.
	stateParked
	// statePending: unpublished and not parked: behind an unpublished
	// event of its aggregate, leased by another relay, or backing off
	// after a failure (dueIn). A later call may claim it.
	statePending
)

// idState is an id's state after a call.
type idState struct {
	kind  stateKind
	dueIn time.Duration // statePending: until its backoff ends (0: due)
}

// stateSQL reads the state of the events $1, one primary-key lookup each
// (OFFSET 0 keeps it so, as in missingIDsSQL). A live lease, this relay's
// own included, is pending: the events a call acknowledged are known from
// its result (PublishIDsResult.PublishedIDs), and an event leased by this
// relay's name and not among them was never acknowledged (a failed call, or
// a process of the same ID that died after its claim).
func stateSQL(events string) string {
	return `SELECT i.id, CASE
		WHEN e.event_id IS NULL OR e.published_at IS NOT NULL THEN 1
		WHEN e.quarantined_at IS NOT NULL OR e.available_at = 'infinity' THEN 2
		ELSE 3 END,
	CASE WHEN e.available_at > now() AND e.available_at < 'infinity'
		THEN extract(epoch FROM e.available_at - now())::float8 ELSE 0 END
FROM unnest($1::uuid[]) AS i(id)
LEFT JOIN LATERAL (
	SELECT e.event_id, e.published_at, e.claimed_by, e.claim_until, e.quarantined_at, e.available_at
	FROM ` + events + ` e WHERE e.event_id = i.id OFFSET 0) e ON true`
}

// states reads the state of ids.
func (p *publisher) states(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]idState, error) {
	rows, err := p.cfg.Pool.Query(ctx, p.state, ids)
	if err != nil {
		return nil, fmt.Errorf("outboxcdc: read the state of events not published: %w", err)
	}
	defer rows.Close()
	out := make(map[uuid.UUID]idState, len(ids))
	for rows.Next() {
		var id uuid.UUID
		var kind int
		var due float64
		if err := rows.Scan(&id, &kind, &due); err != nil {
			return nil, fmt.Errorf("outboxcdc: read the state of events not published: %w", err)
		}
		out[id] = idState{kind: stateKind(kind), dueIn: time.Duration(due * float64(time.Second))}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxcdc: read the state of events not published: %w", err)
	}
	return out, nil
}
