package sideeffect

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/pgtx"
)

// WaitCursor is where a page of waiting events ends; pass it as
// WaitsFilter.After for the next page.
type WaitCursor struct {
	Consumer string    `json:"consumer"`
	EventID  uuid.UUID `json:"event_id"`
}

// WaitsFilter narrows Admin.Waits.
type WaitsFilter struct {
	// Name, when set, restricts the list to the events waiting on
	// attempts of that name.
	Name string
	// Limit is the most events listed. Defaults to 100.
	Limit int
	// After, when set, starts after that event (the previous page's Next).
	After *WaitCursor
}

// WaitsPage is one page of waiting events.
type WaitsPage struct {
	Waits []WaitingEvent `json:"waits"`
	// Next is set when more follow.
	Next *WaitCursor `json:"next,omitempty"`
}

// Waits lists the events waiting on an attempt (Caller.WaitTx), of every
// consumer and attempt in the schema, by consumer, then event id (for the
// events an outbox writer made, time-ordered UUIDv7s: oldest first), a
// page at a time. It reads the primary key's order (with Name, that name's
// waits, on side_effect_waits_due_idx), so a page costs the same however
// many events wait. A schema without the side_effect_waits table (before
// migration 16) has none.
func (a *Admin) Waits(ctx context.Context, f WaitsFilter) (WaitsPage, error) {
	if f.Limit < 0 {
		return WaitsPage{}, fmt.Errorf("sideeffect: waits: limit %d is negative", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	// The first page has no cursor condition, so that the index is read
	// from its start.
	cond, args := "", []any{f.Name, f.Limit + 1}
	if f.After != nil {
		cond = ` AND (consumer_name, event_id) > ($3, $4)`
		args = append(args, f.After.Consumer, f.After.EventID)
	}
	// The ORDER BY names the table's columns (w.): a bare event_id would
	// be the select list's event_id::text, which no index holds in order,
	// and every page would scan and sort every waiting event.
	rows, err := a.db.Query(ctx, `SELECT `+waitingColumns+` FROM `+a.waits+` w
WHERE ($1 = '' OR name = $1)`+cond+`
ORDER BY w.consumer_name, w.event_id
LIMIT $2`, args...)
	var list []WaitingEvent
	if err == nil {
		list, err = pgtx.Collect(rows, scanWaiting)
	}
	if undefinedTable(err) {
		return WaitsPage{Waits: []WaitingEvent{}}, nil
	}
	if err != nil {
		return WaitsPage{}, fmt.Errorf("sideeffect: events waiting in schema %s: %w", a.schema.Name(), err)
	}
	page := WaitsPage{Waits: list}
	if len(list) > f.Limit {
		page.Waits = list[:f.Limit]
		last := page.Waits[f.Limit-1]
		id, err := uuid.Parse(last.EventID)
		if err != nil {
			return WaitsPage{}, fmt.Errorf("sideeffect: events waiting in schema %s: %w", a.schema.Name(), err)
		}
		page.Next = &WaitCursor{Consumer: last.Consumer, EventID: id}
	}
	return page, nil
}

// CountWaitsMax bounds the count of Admin.CountWaits.
const CountWaitsMax = 10000

// CountWaits counts the events waiting on an attempt in the schema, every
// consumer and name, reading at most CountWaitsMax of them: more reports
// that there are more than n (n is then CountWaitsMax). A schema without
// the side_effect_waits table (before migration 16) has none.
func (a *Admin) CountWaits(ctx context.Context) (n int64, more bool, err error) {
	err = a.db.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+a.waits+` LIMIT $1) w`, CountWaitsMax+1).Scan(&n)
	if undefinedTable(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("sideeffect: count the events waiting in schema %s: %w", a.schema.Name(), err)
	}
	if n > CountWaitsMax {
		return CountWaitsMax, true, nil
	}
	return n, false, nil
}

// waitingColumns are WaitingEvent's columns of side_effect_waits.
const waitingColumns = `consumer_name, event_id::text, name, key, event_type, aggregate_type, aggregate_id, sequence,
	waiting_since, wakes, coalesce(last_error, '')`

func scanWaiting(row pgtx.Row) (WaitingEvent, error) {
	var w WaitingEvent
	err := row.Scan(&w.Consumer, &w.EventID, &w.Name, &w.Key, &w.EventType, &w.AggregateType, &w.AggregateID, &w.Sequence, &w.Since, &w.Wakes, &w.LastError)
	w.Since = w.Since.UTC()
	return w, err
}

// undefinedTable reports a query on a table that does not exist: the
// side_effect_waits table of a schema before migration 16.
func undefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
