package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Finding events: what the console's search runs. Every statement reads a
// bounded range of an index (the primary key, the unique (aggregate type,
// id, sequence) key, outbox_pending_lane_idx, outbox_published_at_idx), so
// that a search stays fast over a million pending events. There is no index
// on event_type: a search by type walks an index in its own order and reads
// at most TypeScanLimitDefault events per call, saying where it stopped.

// Defaults of the search.
const (
	// TypeScanLimitDefault is the most events FindEventsByType reads per
	// call.
	TypeScanLimitDefault = 10000
	// LaneCountLimit is the most unsettled events Lane counts.
	LaneCountLimit = 10000
)

// EventView is an event as an operator looks it up: its EventInfo, when it
// is due, and whether it is parked or held by a relay.
type EventView struct {
	EventInfo
	// AvailableAt is when the event is due; zero when it is parked.
	AvailableAt time.Time `json:"available_at,omitzero"`
	// Parked is set for an unsettled event waiting behind a quarantined one
	// of its aggregate (available_at is 'infinity': out of the claim).
	Parked bool `json:"parked,omitempty"`
	// ClaimedBy and ClaimUntil are the relay holding the event and until
	// when; Leased is set while that lease runs (by the database's clock).
	ClaimedBy  string     `json:"claimed_by,omitempty"`
	ClaimUntil *time.Time `json:"claim_until,omitempty"`
	Leased     bool       `json:"leased,omitempty"`
}

// State is EventInfo.State, with "parked" for a pending event out of the
// claim behind a quarantined one.
func (v EventView) State() string {
	st := v.EventInfo.State()
	if st == "pending" && v.Parked {
		return "parked"
	}
	return st
}

const eventViewColumns = eventInfoColumns + `,
	CASE WHEN isfinite(e.available_at) THEN e.available_at END, NOT isfinite(e.available_at),
	coalesce(e.claimed_by, ''), e.claim_until, coalesce(e.claim_until > now(), false)`

func scanEventView(row pgx.Row, extra ...any) (EventView, error) {
	var v EventView
	err := scanEventViewInto(&v, row, extra...)
	return v, err
}

func scanEventViewInto(v *EventView, row pgx.Row, extra ...any) error {
	var at *time.Time
	e, err := scanEventInfo(row, append([]any{&at, &v.Parked, &v.ClaimedBy, &v.ClaimUntil, &v.Leased}, extra...)...)
	v.EventInfo = e
	if at != nil {
		v.AvailableAt = at.UTC()
	}
	if v.ClaimUntil != nil {
		*v.ClaimUntil = v.ClaimUntil.UTC()
	}
	return err
}

// EventDetail is everything about one event: its view, headers and
// payload.
type EventDetail struct {
	EventView
	// ContentType is the payload's media type (ContentTypeJSON when the
	// event has none).
	ContentType string
	// Headers are the event's headers. HeadersRaw is their JSON as stored,
	// kept when it is not an object of strings (a row written by hand).
	Headers    map[string]string
	HeadersRaw string
	// Payload is the payload as written (payload_bytes, or the text of a
	// jsonb payload), at most the maxPayload bytes asked for; PayloadSize
	// is its whole size, in bytes.
	Payload     []byte
	PayloadSize int64
}

// EventDetail returns one event with its headers and at most maxPayload
// bytes of its payload (all of it when maxPayload is not positive).
func (a *Admin) EventDetail(ctx context.Context, id uuid.UUID, maxPayload int) (EventDetail, error) {
	var d EventDetail
	var headers string
	limit := any(nil)
	if maxPayload > 0 {
		limit = maxPayload
	}
	err := scanEventViewInto(&d.EventView, a.db.QueryRow(ctx, `SELECT `+eventViewColumns+`,
	coalesce(e.content_type, '`+ContentTypeJSON+`'), e.headers::text,
	coalesce(octet_length(e.payload_bytes), octet_length(e.payload::text)),
	substring(coalesce(e.payload_bytes, convert_to(e.payload::text, 'UTF8')) FROM 1 FOR coalesce($2, 2147483647))
FROM `+a.t.events+` e WHERE e.event_id = $1`, id, limit), &d.ContentType, &headers, &d.PayloadSize, &d.Payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return EventDetail{}, fmt.Errorf("outbox: event %s: %w", id, ErrEventNotFound)
	}
	if err != nil {
		return EventDetail{}, fmt.Errorf("outbox: event %s: %w", id, err)
	}
	if headers != "" && headers != "{}" && headers != "null" {
		if json.Unmarshal([]byte(headers), &d.Headers) != nil {
			d.Headers, d.HeadersRaw = nil, headers
		}
	}
	return d, nil
}

// Lane is one aggregate's lane: how far it is published and what waits in
// it.
type Lane struct {
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	// LastSequence is the highest sequence handed out (the counter row's
	// floor or the lane's last event, whichever is higher); zero when the
	// aggregate has none.
	LastSequence int64 `json:"last_sequence"`
	// PublishedThrough is the sequence every event up to which is settled
	// (published or skipped): the head's minus one, or LastSequence when
	// nothing is unsettled.
	PublishedThrough int64 `json:"published_through"`
	// Head is the first unsettled event, if any.
	Head *EventView `json:"head,omitempty"`
	// Pending, Parked and Quarantined count the unsettled events: not
	// quarantined (of which Parked are out of the claim), and quarantined.
	// They count at most LaneCountLimit events in all; CountsCapped says
	// the lane holds more.
	Pending      int64 `json:"pending"`
	Parked       int64 `json:"parked"`
	Quarantined  int64 `json:"quarantined"`
	CountsCapped bool  `json:"counts_capped,omitempty"`
	// ParkedAt is set while the lane is flagged parked (its writers write
	// their events parked), since then.
	ParkedAt *time.Time `json:"parked_at,omitempty"`
}

// Lane returns one aggregate's lane, read in one snapshot: its counter row,
// its head and its unsettled events (at most LaneCountLimit of them, from
// outbox_pending_lane_idx). An aggregate that never had an event has a
// zero Lane.
func (a *Admin) Lane(ctx context.Context, aggregateType, aggregateID string) (Lane, error) {
	l := Lane{AggregateType: aggregateType, AggregateID: aggregateID}
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{RepeatableRead: true, ReadOnly: true}, func(tx pgtx.Querier) error {
		err := tx.QueryRow(ctx, `SELECT `+laneLastSQL(a.t.events, "c")+`, c.parked_at FROM `+a.schema.Table("outbox_aggregates")+` c
WHERE c.aggregate_type = $1 AND c.aggregate_id = $2`, aggregateType, aggregateID).Scan(&l.LastSequence, &l.ParkedAt)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		head, err := scanEventView(tx.QueryRow(ctx, `SELECT `+eventViewColumns+` FROM `+a.t.events+` e
WHERE e.published_at IS NULL AND e.aggregate_type = $1 AND e.aggregate_id = $2
ORDER BY e.aggregate_sequence LIMIT 1`, aggregateType, aggregateID))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			l.PublishedThrough = l.LastSequence
			return nil
		case err != nil:
			return err
		}
		l.Head, l.PublishedThrough = &head, head.Sequence-1
		var n int64
		err = tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE q), count(*) FILTER (WHERE NOT q AND p)
FROM (SELECT e.quarantined_at IS NOT NULL AS q, NOT isfinite(e.available_at) AS p FROM `+a.t.events+` e
	WHERE e.published_at IS NULL AND e.aggregate_type = $1 AND e.aggregate_id = $2
	ORDER BY e.aggregate_sequence LIMIT `+strconv.Itoa(LaneCountLimit+1)+`) s`, aggregateType, aggregateID).Scan(&n, &l.Quarantined, &l.Parked)
		if err != nil {
			return err
		}
		l.Pending = n - l.Quarantined
		if n > LaneCountLimit {
			l.CountsCapped = true
		}
		return nil
	})
	if err != nil {
		return Lane{}, fmt.Errorf("outbox: lane %s/%s: %w", aggregateType, aggregateID, err)
	}
	if l.ParkedAt != nil {
		*l.ParkedAt = l.ParkedAt.UTC()
	}
	return l, nil
}

// AggregateEventsFilter selects a page of ListAggregateEvents.
type AggregateEventsFilter struct {
	// AggregateType and AggregateID name the aggregate. Required.
	AggregateType, AggregateID string
	// After lists only the events with a higher sequence (keyset
	// pagination: pass the last event's sequence).
	After int64
	// Limit is the most events listed. Defaults to 100.
	Limit int
}

// ListAggregateEvents returns one aggregate's events in sequence order,
// from after f.After: one range of the unique (aggregate_type,
// aggregate_id, aggregate_sequence) index.
func (a *Admin) ListAggregateEvents(ctx context.Context, f AggregateEventsFilter) ([]EventView, error) {
	switch {
	case f.AggregateType == "" || f.AggregateID == "":
		return nil, errors.New("outbox: list aggregate events: the aggregate type and id are required")
	case f.Limit < 0:
		return nil, fmt.Errorf("outbox: list aggregate events: limit %d is negative", f.Limit)
	case f.Limit == 0:
		f.Limit = 100
	}
	rows, err := a.db.Query(ctx, `SELECT `+eventViewColumns+` FROM `+a.t.events+` e
WHERE e.aggregate_type = $1 AND e.aggregate_id = $2 AND e.aggregate_sequence > $3
ORDER BY e.aggregate_sequence LIMIT $4`, f.AggregateType, f.AggregateID, f.After, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list aggregate events: %w", err)
	}
	out, err := pgtx.Collect(rows, func(row pgtx.Row) (EventView, error) { return scanEventView(row) })
	if err != nil {
		return nil, fmt.Errorf("outbox: list aggregate events: %w", err)
	}
	return out, nil
}

// EventTypeFilter selects a page of FindEventsByType.
type EventTypeFilter struct {
	// EventType is the type searched for. Required.
	EventType string
	// Settled searches the settled events (published or skipped), most
	// recently settled first; by default the unsettled ones (pending,
	// parked, quarantined), by aggregate and sequence.
	Settled bool
	// After continues a search from where the last call stopped
	// (EventTypePage.Next).
	After *EventTypeCursor
	// Limit is the most events returned. Defaults to 100.
	Limit int
	// ScanLimit is the most events read to find them. Defaults to
	// TypeScanLimitDefault.
	ScanLimit int
}

// EventTypeCursor is a position in FindEventsByType's order: an unsettled
// event's aggregate and sequence, or a settled event's settlement time and
// id.
type EventTypeCursor struct {
	AggregateType string    `json:"t,omitempty"`
	AggregateID   string    `json:"a,omitempty"`
	Sequence      int64     `json:"s,omitempty"`
	PublishedAt   time.Time `json:"p,omitzero"`
	ID            uuid.UUID `json:"i,omitzero"`
}

// EventTypePage is one call's result of FindEventsByType.
type EventTypePage struct {
	// Events are the events found, in the search's order.
	Events []EventView
	// Scanned is how many events this call read.
	Scanned int
	// Next, when set, is where to go on (EventTypeFilter.After): past the
	// last event returned when Limit was reached, or past the last event
	// read when ScanLimit was. Nil when the search reached the end.
	Next *EventTypeCursor
}

// FindEventsByType finds events of one type. There is no index on the
// type: the search walks outbox_pending_lane_idx (unsettled events) or
// outbox_published_at_idx (settled ones, newest first) from f.After, reads
// at most f.ScanLimit entries (fewer when it finds f.Limit+1 events of the
// type first) and keeps those of the type, so a call costs at most the same
// whatever the backlog, and a rare type takes several calls over a large
// one (each says how far it got).
func (a *Admin) FindEventsByType(ctx context.Context, f EventTypeFilter) (EventTypePage, error) {
	switch {
	case f.EventType == "":
		return EventTypePage{}, errors.New("outbox: find events by type: the event type is required")
	case f.Limit < 0 || f.ScanLimit < 0:
		return EventTypePage{}, fmt.Errorf("outbox: find events by type: negative limit (%d, %d)", f.Limit, f.ScanLimit)
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	if f.ScanLimit == 0 {
		f.ScanLimit = TypeScanLimitDefault
	}
	// t, a, s: an unsettled event's key; p, i: a settled one's (and the
	// event id of both).
	keys, order, outer, where := "e.aggregate_type AS t, e.aggregate_id AS a, e.aggregate_sequence AS s, 'epoch'::timestamptz AS p",
		"e.aggregate_type, e.aggregate_id, e.aggregate_sequence", "t, a, s", "e.published_at IS NULL"
	args := []any{f.EventType}
	if f.Settled {
		keys, order, outer, where = "''::text AS t, ''::text AS a, 0::bigint AS s, e.published_at AS p",
			"e.published_at DESC, e.event_id DESC", "p DESC, i DESC", "e.published_at IS NOT NULL"
	}
	if c := f.After; c != nil {
		if f.Settled {
			args = append(args, c.PublishedAt, c.ID)
			// The bare bound lets the planner start the index scan there.
			where += " AND e.published_at <= $2 AND (e.published_at, e.event_id) < ($2, $3)"
		} else {
			args = append(args, c.AggregateType, c.AggregateID, c.Sequence)
			where += " AND (e.aggregate_type, e.aggregate_id, e.aggregate_sequence) > ($2, $3, $4)"
		}
	}
	// sc is the walk, in the index's order; the outer query keeps the
	// events of the type (up to Limit+1, to know there are more) and the
	// walk's last row (no row after it), which says where it stopped. It
	// streams: once Limit+1 events of the type are found, the walk stops
	// there. The limits are written in the statement, not passed: a cached
	// generic plan would otherwise guess them, and might sort the whole
	// backlog instead of walking the index.
	rows, err := a.db.Query(ctx, `SELECT t, a, s, p, i, hit, n, last FROM (
	SELECT sc.*, row_number() OVER w AS n, NOT lead(true, 1, false) OVER w AS last FROM (
		SELECT `+keys+`, e.event_id AS i, e.event_type = $1 AS hit FROM `+a.t.events+` e
		WHERE `+where+`
		ORDER BY `+order+`
		LIMIT `+strconv.Itoa(f.ScanLimit)+`) sc
	WINDOW w AS (ORDER BY `+outer+`)) x
WHERE hit OR last
ORDER BY `+outer+`
LIMIT `+strconv.Itoa(f.Limit+2), args...)
	if err != nil {
		return EventTypePage{}, fmt.Errorf("outbox: find events by type: %w", err)
	}
	type found struct {
		cur       EventTypeCursor
		hit, last bool
		n         int64
	}
	walked, err := pgtx.Collect(rows, func(row pgtx.Row) (found, error) {
		var r found
		err := row.Scan(&r.cur.AggregateType, &r.cur.AggregateID, &r.cur.Sequence, &r.cur.PublishedAt, &r.cur.ID, &r.hit, &r.n, &r.last)
		if !f.Settled {
			r.cur.PublishedAt = time.Time{}
		}
		return r, err
	})
	if err != nil {
		return EventTypePage{}, fmt.Errorf("outbox: find events by type: %w", err)
	}
	var page EventTypePage
	var hits []found
	for _, r := range walked {
		page.Scanned = int(r.n)
		if r.hit {
			hits = append(hits, r)
		}
	}
	switch end := len(walked) - 1; {
	case len(hits) > f.Limit:
		hits = hits[:f.Limit]
		c := hits[len(hits)-1].cur
		page.Next, page.Scanned = &c, int(hits[len(hits)-1].n)
	case end >= 0 && walked[end].last && walked[end].n == int64(f.ScanLimit):
		// The walk stopped at its limit, not at the end.
		c := walked[end].cur
		page.Next = &c
	}
	if len(hits) == 0 {
		return page, nil
	}
	ids := make([]uuid.UUID, len(hits))
	for i, h := range hits {
		ids[i] = h.cur.ID
	}
	rows, err = a.db.Query(ctx, `SELECT `+eventViewColumns+` FROM `+a.t.events+` e WHERE e.event_id = ANY($1)`, ids)
	if err != nil {
		return EventTypePage{}, fmt.Errorf("outbox: find events by type: %w", err)
	}
	views, err := pgtx.Collect(rows, func(row pgtx.Row) (EventView, error) { return scanEventView(row) })
	if err != nil {
		return EventTypePage{}, fmt.Errorf("outbox: find events by type: %w", err)
	}
	// In the walk's order; an event deleted (cleaned up) in between is
	// left out.
	for _, id := range ids {
		if i := slices.IndexFunc(views, func(v EventView) bool { return v.ID == id }); i >= 0 {
			page.Events = append(page.Events, views[i])
		}
	}
	return page, nil
}
