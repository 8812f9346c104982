package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgoutbox/outbox/internal/pgtx"
)

// MinuteHistory is one minute of the outbox's last hour (Admin.History).
type MinuteHistory struct {
	// Minute is the minute's start (the database's clock, UTC).
	Minute time.Time `json:"minute"`
	// Published counts the events published (not skipped) in it.
	Published int64 `json:"published"`
	// Unsettled counts the events unsettled at the minute's end (now for
	// the current minute): the backlog, quarantined events included.
	Unsettled int64 `json:"unsettled"`
	// LatencyP50Seconds and LatencyMaxSeconds are the median and the
	// longest commit→ack time of the events published in it:
	// published_at - occurred_at, from the writing transaction's start to
	// the relay's mark after the destination's ack. 0 when none was
	// published.
	LatencyP50Seconds float64 `json:"latency_p50_seconds"`
	LatencyMaxSeconds float64 `json:"latency_max_seconds"`
	// Failed counts the publish attempts that failed in it, as the relays
	// recorded them in their heartbeat rows (RelayHealth.Minutes,
	// migration 015; by each relay's clock). A relay that stopped cleanly
	// deleted its row, and its failures with it.
	Failed int64 `json:"failed"`
}

// History returns the last 60 whole minutes and the current one, oldest
// first (61 entries, as PublishedPerMinute): published events, the backlog
// at each minute's end, the commit→ack latency and the failed publish
// attempts. It reads, in one read-only snapshot, the events published in
// the last hour (a range of outbox_published_at_idx), the unsettled events
// once (as Status does: its cost grows with the backlog) and the relays'
// heartbeat rows. The backlog at a past minute's end is rebuilt from those
// rows: an event counts from its occurred_at until its published_at (an
// event inserted with an occurred_at in the past counts from then).
func (a *Admin) History(ctx context.Context) ([]MinuteHistory, error) {
	var out []MinuteHistory
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{RepeatableRead: true, ReadOnly: true}, func(tx pgtx.Querier) error {
		var nowMinute time.Time
		if err := tx.QueryRow(ctx, `SELECT date_trunc('minute', now())`).Scan(&nowMinute); err != nil {
			return err
		}
		nowMinute = nowMinute.UTC()
		start := nowMinute.Add(-60 * time.Minute)
		out = make([]MinuteHistory, 61)
		for i := range out {
			out[i].Minute = start.Add(time.Duration(i) * time.Minute)
		}
		// index of a minute in out: -1 before the window.
		idx := func(m time.Time) int {
			i := int(m.UTC().Sub(start) / time.Minute)
			return max(min(i, 60), -1)
		}
		// settledAfter[i]: events of the hour settled after minute i's end;
		// occurredAfter[i]: those of them that occurred after it too.
		var settledIn, occurredIn [61]int64
		rows, err := tx.Query(ctx, `SELECT date_trunc('minute', e.published_at), count(*), count(*) FILTER (WHERE e.skipped_at IS NULL),
	coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.published_at - e.occurred_at)::float8) FILTER (WHERE e.skipped_at IS NULL), 0)::float8,
	coalesce(max(extract(epoch FROM e.published_at - e.occurred_at)::float8) FILTER (WHERE e.skipped_at IS NULL), 0)::float8
FROM `+a.t.events+` e WHERE e.published_at >= $1 GROUP BY 1`, start)
		if err != nil {
			return fmt.Errorf("read the published events: %w", err)
		}
		var m time.Time
		var settled, published int64
		var p50, pmax float64
		if err := eachRow(rows, []any{&m, &settled, &published, &p50, &pmax}, func() error {
			if i := idx(m); i >= 0 {
				settledIn[i] += settled
				out[i].Published += published
				out[i].LatencyP50Seconds, out[i].LatencyMaxSeconds = max(p50, 0), max(pmax, 0)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("read the published events: %w", err)
		}
		var n int64
		rows, err = tx.Query(ctx, `SELECT greatest(date_trunc('minute', e.occurred_at), $1::timestamptz - interval '1 minute'), count(*)
FROM `+a.t.events+` e WHERE e.published_at >= $1 GROUP BY 1`, start)
		if err != nil {
			return fmt.Errorf("read the published events: %w", err)
		}
		if err := eachRow(rows, []any{&m, &n}, func() error {
			if i := idx(m); i >= 0 {
				occurredIn[i] += n
			}
			return nil
		}); err != nil {
			return fmt.Errorf("read the published events: %w", err)
		}
		// pendingBy[i+1]: unsettled events that occurred in minute i
		// (pendingBy[0]: before the window).
		var pendingBy [62]int64
		rows, err = tx.Query(ctx, `-- history: the pass over the backlog
SELECT greatest(date_trunc('minute', e.occurred_at), $1::timestamptz - interval '1 minute'), count(*)
FROM `+a.t.events+` e WHERE e.published_at IS NULL GROUP BY 1`, start)
		if err != nil {
			return fmt.Errorf("read the backlog: %w", err)
		}
		if err := eachRow(rows, []any{&m, &n}, func() error {
			pendingBy[idx(m)+1] += n
			return nil
		}); err != nil {
			return fmt.Errorf("read the backlog: %w", err)
		}
		// Unsettled at the end of minute i: the unsettled events that had
		// occurred by then, plus the events of the hour that had occurred
		// by then but were settled after.
		var pendingUpTo, settledAfter, occurredAfter int64
		for _, n := range settledIn {
			settledAfter += n
		}
		for _, n := range occurredIn {
			occurredAfter += n
		}
		pendingUpTo = pendingBy[0]
		for i := range out {
			pendingUpTo += pendingBy[i+1]
			settledAfter -= settledIn[i]
			occurredAfter -= occurredIn[i]
			out[i].Unsettled = max(pendingUpTo+settledAfter-occurredAfter, 0)
		}
		// The failures the relays recorded: not those of a row whose
		// heartbeat is ahead of the clock, nor of a health document over
		// RelayNoteMaxBytes (Admin.Status does not believe them either).
		rows, err = tx.Query(ctx, `SELECT CASE WHEN coalesce(pg_column_size(h.health), 0) <= $1 THEN h.health -> 'minutes' END
FROM `+a.t.relays+` r CROSS JOIN LATERAL (SELECT to_jsonb(r) -> 'health' AS health) h
WHERE r.heartbeat_at <= now() + make_interval(secs => $2)`, RelayNoteMaxBytes, RelayClockSkew.Seconds())
		if err != nil {
			return fmt.Errorf("read the relays: %w", err)
		}
		var doc []byte
		err = eachRow(rows, []any{&doc}, func() error {
			var minutes []RelayMinute
			if len(doc) == 0 || json.Unmarshal(doc, &minutes) != nil {
				return nil // not recorded, or not readable: no failures to add
			}
			for _, rm := range minutes {
				// A minute past the current one (beyond a relay clock's
				// RelayClockSkew) is not a minute any relay lived.
				if i := idx(rm.Minute); i >= 0 && !rm.Minute.Before(start) && !rm.Minute.After(nowMinute.Add(RelayClockSkew)) {
					out[i].Failed += rm.Failed
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read the relays: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: history of schema %s: %w", a.schema.Name(), err)
	}
	return out, nil
}

// eachRow scans each row of rows into dest and calls fn, then closes rows.
func eachRow(rows pgtx.Rows, dest []any, fn func() error) error {
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if err := fn(); err != nil {
			return err
		}
	}
	return rows.Err()
}
