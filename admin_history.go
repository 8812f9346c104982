package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox/internal/pgtx"
)

// MinuteCount is the number of events published in one minute.
type MinuteCount struct {
	// Minute is the start of the minute (UTC); Published the events
	// published (not skipped) in it.
	Minute    time.Time `json:"minute"`
	Published int64     `json:"published"`
}

// PublishedPerMinute returns the events published (not skipped) in each of
// the last 60 whole minutes and the current one, oldest first: 61 entries,
// minutes with none included. It is one GROUP BY over a range scan of
// outbox_published_at_idx bounded to the last hour, so its cost grows with
// the events published in that hour, never with the history kept or the
// backlog.
func (a *Admin) PublishedPerMinute(ctx context.Context) ([]MinuteCount, error) {
	rows, err := a.db.Query(ctx, `WITH m AS (SELECT date_trunc('minute', now()) AS now_minute)
SELECT s.minute, coalesce(c.n, 0)
FROM m CROSS JOIN generate_series(m.now_minute - interval '60 minutes', m.now_minute, interval '1 minute') AS s(minute)
LEFT JOIN (
	SELECT date_trunc('minute', e.published_at) AS minute, count(*) AS n
	FROM `+a.t.events+` e, m
	WHERE e.published_at >= m.now_minute - interval '60 minutes' AND e.skipped_at IS NULL
	GROUP BY 1
) c ON c.minute = s.minute
ORDER BY s.minute`)
	if err != nil {
		return nil, fmt.Errorf("outbox: published per minute: %w", err)
	}
	out, err := pgtx.Collect(rows, func(row pgtx.Row) (MinuteCount, error) {
		var c MinuteCount
		err := row.Scan(&c.Minute, &c.Published)
		c.Minute = c.Minute.UTC()
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: published per minute: %w", err)
	}
	return out, nil
}

// OperationFilter selects a page of Admin.Operations.
type OperationFilter struct {
	// Before, when positive, lists only operations with a smaller ID
	// (keyset pagination: pass the ID of the last operation of the previous
	// page).
	Before int64
	// Limit is the most operations listed. Defaults to 100.
	Limit int
}

// Operations returns operator actions from the audit log (outbox_operations),
// newest first, one page at a time: each page is a scan of the primary key
// from its cursor.
func (a *Admin) Operations(ctx context.Context, f OperationFilter) ([]Operation, error) {
	switch {
	case f.Limit < 0:
		return nil, fmt.Errorf("outbox: operations: limit %d is negative", f.Limit)
	case f.Before < 0:
		return nil, fmt.Errorf("outbox: operations: cursor %d is negative", f.Before)
	case f.Limit == 0:
		f.Limit = 100
	}
	// Two statements rather than "$1 = 0 OR operation_id < $1": a cached
	// generic plan of that would filter instead of seeking to the cursor.
	q, args := `SELECT operation_id, at, action, actor, event_id, coalesce(reason, ''), detail
FROM `+a.t.operations+` ORDER BY operation_id DESC LIMIT $1`, []any{f.Limit}
	if f.Before > 0 {
		q, args = `SELECT operation_id, at, action, actor, event_id, coalesce(reason, ''), detail
FROM `+a.t.operations+` WHERE operation_id < $2 ORDER BY operation_id DESC LIMIT $1`, []any{f.Limit, f.Before}
	}
	rows, err := a.db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: operations: %w", err)
	}
	out, err := pgtx.Collect(rows, scanOperation)
	if err != nil {
		return nil, fmt.Errorf("outbox: operations: %w", err)
	}
	return out, nil
}

func scanOperation(row pgtx.Row) (Operation, error) {
	var o Operation
	var detail []byte // jsonb: raw JSON on every driver
	err := row.Scan(&o.ID, &o.At, &o.Action, &o.Actor, &o.EventID, &o.Reason, &detail)
	o.At = o.At.UTC()
	if err == nil && len(detail) > 0 && string(detail) != "null" {
		if jerr := json.Unmarshal(detail, &o.Detail); jerr != nil {
			return o, fmt.Errorf("operation %d: detail: %w", o.ID, jerr)
		}
	}
	return o, err
}
