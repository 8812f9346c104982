package inbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Errors of the start and operator API. They are wrapped with the aggregate.
var (
	// ErrReasonRequired: a seed or resolve without a reason was refused.
	ErrReasonRequired = errors.New("a reason is required")
	// ErrActorRequired: a resolve without who does it was refused.
	ErrActorRequired = errors.New("an operator action needs who does it")
	// ErrMarkAhead: the consumer's high-water mark of the aggregate is
	// already at or past the requested sequence. A mark never goes back:
	// the events below it were applied (or passed over) already.
	ErrMarkAhead = errors.New("the high-water mark is already at or past that sequence")
	// ErrNotWaiting: a resolve without an explicit target was refused
	// because the aggregate is not waiting on a gap.
	ErrNotWaiting = errors.New("the aggregate is not waiting on a gap")
	// ErrAggregateNotFound: the consumer has no high-water mark for the
	// aggregate (it never saw an event of it).
	ErrAggregateNotFound = errors.New("the consumer has no high-water mark for the aggregate")
)

// StartKind says how an aggregate's high-water mark was set explicitly,
// rather than by applying its events from sequence 1. It is stored in
// inbox_aggregates.start_kind.
type StartKind string

const (
	// StartFirstSeen: the inbox took the first event it saw of the aggregate
	// as its start (Config.StartAtFirstSeen).
	StartFirstSeen StartKind = "first_seen"
	// StartSeeded: the application set the mark (Inbox.Seed, Inbox.SeedTx).
	StartSeeded StartKind = "seeded"
	// StartResolved: an operator moved the mark past a gap (Admin.Resolve,
	// `outbox inbox resolve`).
	StartResolved StartKind = "resolved"
)

// Start records the latest explicit setting of an aggregate's high-water
// mark. The events PriorMark+1 .. Mark were never applied by the consumer.
type Start struct {
	// Kind says how the mark was set.
	Kind StartKind `json:"kind"`
	// PriorMark is the mark before (0 for an aggregate new to the
	// consumer); Mark the mark set.
	PriorMark int64 `json:"prior_mark"`
	Mark      int64 `json:"mark"`
	// At is when, Reason why, By who (an operator, for a resolve).
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
	By     string    `json:"by,omitempty"`
}

// Wait describes an aggregate waiting on a gap: the inbox refused an event
// as early because an earlier one has not been applied.
type Wait struct {
	// Since is when the first early delivery of this wait was refused.
	Since time.Time `json:"since"`
	// Expected is the sequence the inbox waits for (the mark + 1); Seen the
	// lowest sequence delivered since the wait began.
	Expected int64 `json:"expected_sequence"`
	Seen     int64 `json:"seen_sequence"`
	// AgeSeconds is how long it has waited, by the database's clock.
	AgeSeconds float64 `json:"age_seconds"`
}

// AggregateInfo is a consumer's high-water mark of one aggregate.
type AggregateInfo struct {
	Consumer      string `json:"consumer"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
	// LastSequence is the high-water mark: the last sequence applied (or
	// passed over by a start).
	LastSequence int64 `json:"last_sequence"`
	// UpdatedAt is when the mark last moved.
	UpdatedAt time.Time `json:"updated_at"`
	// Start is set when the mark was set explicitly (the latest time); nil
	// when the consumer applied every event from sequence 1.
	Start *Start `json:"start,omitempty"`
	// Wait is set while the aggregate waits on a gap.
	Wait *Wait `json:"waiting,omitempty"`
}

const aggregateColumns = `consumer_name, aggregate_type, aggregate_id, last_sequence, updated_at,
	start_kind, coalesce(start_prior_mark, 0), coalesce(start_mark, 0), started_at, coalesce(start_reason, ''), coalesce(start_by, ''),
	waiting_since, coalesce(waiting_for, 0), coalesce(waiting_seen, 0), coalesce(extract(epoch FROM now() - waiting_since), 0)::float8`

func scanAggregate(row pgtx.Row) (AggregateInfo, error) {
	var a AggregateInfo
	var kind *string
	var s Start
	var startedAt, waitingSince *time.Time
	var w Wait
	if err := row.Scan(&a.Consumer, &a.AggregateType, &a.AggregateID, &a.LastSequence, &a.UpdatedAt,
		&kind, &s.PriorMark, &s.Mark, &startedAt, &s.Reason, &s.By,
		&waitingSince, &w.Expected, &w.Seen, &w.AgeSeconds); err != nil {
		return a, err
	}
	a.UpdatedAt = a.UpdatedAt.UTC()
	if kind != nil && startedAt != nil {
		s.Kind, s.At = StartKind(*kind), startedAt.UTC()
		a.Start = &s
	}
	if waitingSince != nil {
		w.Since = waitingSince.UTC()
		a.Wait = &w
	}
	return a, nil
}

// AdminConfig configures an Admin.
type AdminConfig struct {
	// Schema is the PostgreSQL schema holding the inbox tables, as a plain
	// string: the older field, kept working; prefer Tables. Defaults to
	// "outbox".
	Schema string
	// Tables is the schema holding the inbox tables: the one outbox.Schema value
	// an application gives every component's config. Setting it and Schema
	// to different names is refused (outbox.ErrSchemaConflict). Defaults to
	// Schema, then "outbox".
	Tables outbox.Schema
}

// Admin is the operator's API of the inboxes of a schema, for every
// consumer: what `outbox inbox status` and `outbox inbox resolve` run, and
// what package outboxprom samples for the inbox gauges. It is safe for
// concurrent use.
//
// It needs the schema at migration version 4 or later.
type Admin struct {
	db         pgtx.DB
	schema     pgident.Schema
	marks      string
	operations string
	lockMark   string
}

// NewAdmin returns an Admin over pool.
func NewAdmin(pool *pgxpool.Pool, cfg AdminConfig) (*Admin, error) {
	if pool == nil {
		return nil, errors.New("inbox: NewAdmin needs a pool")
	}
	return newAdmin(pgtx.Pool(pool), cfg)
}

// NewSQLAdmin returns an Admin over db, a database/sql database (sqlx,
// GORM, bun, ent): the same Admin as NewAdmin's, over database/sql.
func NewSQLAdmin(db *sql.DB, cfg AdminConfig) (*Admin, error) {
	if db == nil {
		return nil, errors.New("inbox: NewSQLAdmin needs a database")
	}
	return newAdmin(pgtx.Database(db), cfg)
}

func newAdmin(db pgtx.DB, cfg AdminConfig) (*Admin, error) {
	s, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("inbox: admin: %w", err)
	}
	marks := s.Table("inbox_aggregates")
	return &Admin{db: db, schema: s, marks: marks, operations: s.Table("outbox_operations"), lockMark: lockMarkSQL(marks)}, nil
}

// Schema is the schema the Admin works on.
func (a *Admin) Schema() string { return a.schema.Name() }

// Aggregate returns a consumer's high-water mark of one aggregate, with its
// start and its wait. It returns ErrAggregateNotFound when the consumer
// never saw an event of the aggregate.
func (a *Admin) Aggregate(ctx context.Context, consumer, aggregateType, aggregateID string) (AggregateInfo, error) {
	info, err := scanAggregate(a.db.QueryRow(ctx, `SELECT `+aggregateColumns+` FROM `+a.marks+`
WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3`, consumer, aggregateType, aggregateID))
	if errors.Is(err, pgx.ErrNoRows) {
		return AggregateInfo{}, fmt.Errorf("inbox: consumer %s, aggregate %s/%s: %w", consumer, aggregateType, aggregateID, ErrAggregateNotFound)
	}
	if err != nil {
		return AggregateInfo{}, fmt.Errorf("inbox: consumer %s, aggregate %s/%s: %w", consumer, aggregateType, aggregateID, err)
	}
	return info, nil
}

// WaitingFilter narrows Admin.Waiting.
type WaitingFilter struct {
	// Consumer and AggregateType, when set, restrict the report to that
	// consumer and that aggregate type.
	Consumer      string
	AggregateType string
	// Limit is the most aggregates listed. Defaults to 100.
	Limit int
	// After, when set, lists only the aggregates after it in the list's
	// order (keyset pagination): pass the WaitingCursor of the last
	// aggregate of the previous page.
	After *WaitingCursor
}

// WaitingCursor is a position in Admin.Waiting's order of aggregates (wait
// start, consumer, aggregate type, aggregate id).
type WaitingCursor struct {
	Since                                time.Time
	Consumer, AggregateType, AggregateID string
}

// WaitingCursor returns the aggregate's position in Admin.Waiting's order,
// for the next page (WaitingFilter.After). The aggregate must be waiting.
func (a AggregateInfo) WaitingCursor() WaitingCursor {
	c := WaitingCursor{Consumer: a.Consumer, AggregateType: a.AggregateType, AggregateID: a.AggregateID}
	if a.Wait != nil {
		c.Since = a.Wait.Since
	}
	return c
}

// ConsumerWaiting counts one consumer's aggregates waiting on a gap.
type ConsumerWaiting struct {
	Consumer string `json:"consumer"`
	// Waiting counts its aggregates waiting on a gap.
	Waiting int64 `json:"waiting"`
	// OldestWaitSeconds is the age of the oldest wait, 0 when none.
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
}

// WaitingReport is what Admin.Waiting returns.
type WaitingReport struct {
	// At is the database's clock when the report was taken.
	At time.Time `json:"at"`
	// Consumers counts, per consumer with at least one, the aggregates
	// waiting on a gap, all of them (not only the ones listed).
	Consumers []ConsumerWaiting `json:"consumers"`
	// Aggregates lists the waiting aggregates, oldest wait first, at most
	// Limit of them.
	Aggregates []AggregateInfo `json:"aggregates"`
}

// Waiting reports the aggregates waiting on a gap: how many per consumer,
// and the oldest waits. Both queries read only the waiting rows (through
// the partial index inbox_aggregates_waiting_idx), never the marks of every
// aggregate.
func (a *Admin) Waiting(ctx context.Context, f WaitingFilter) (WaitingReport, error) {
	if f.Limit < 0 {
		return WaitingReport{}, fmt.Errorf("inbox: waiting: limit %d is negative", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	// The cursor's condition is only there on later pages, so that the plan
	// seeks to it.
	args := []any{f.Consumer, f.AggregateType, f.Limit}
	after := ""
	if c := f.After; c != nil {
		after = "\n  AND (waiting_since, consumer_name, aggregate_type, aggregate_id) > ($4, $5, $6, $7)"
		args = append(args, c.Since, c.Consumer, c.AggregateType, c.AggregateID)
	}
	rep := WaitingReport{Consumers: []ConsumerWaiting{}, Aggregates: []AggregateInfo{}}
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{RepeatableRead: true, ReadOnly: true}, func(tx pgtx.Querier) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&rep.At); err != nil {
			return err
		}
		rep.At = rep.At.UTC()
		rows, err := tx.Query(ctx, `SELECT consumer_name, count(*), extract(epoch FROM now() - min(waiting_since))::float8
FROM `+a.marks+`
WHERE waiting_since IS NOT NULL AND ($1 = '' OR consumer_name = $1) AND ($2 = '' OR aggregate_type = $2)
GROUP BY consumer_name ORDER BY consumer_name`, f.Consumer, f.AggregateType)
		if err != nil {
			return err
		}
		rep.Consumers, err = pgtx.Collect(rows, func(row pgtx.Row) (ConsumerWaiting, error) {
			var c ConsumerWaiting
			return c, row.Scan(&c.Consumer, &c.Waiting, &c.OldestWaitSeconds)
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT `+aggregateColumns+` FROM `+a.marks+`
WHERE waiting_since IS NOT NULL AND ($1 = '' OR consumer_name = $1) AND ($2 = '' OR aggregate_type = $2)`+after+`
ORDER BY waiting_since, consumer_name, aggregate_type, aggregate_id
LIMIT $3`, args...)
		if err != nil {
			return err
		}
		rep.Aggregates, err = pgtx.Collect(rows, func(row pgtx.Row) (AggregateInfo, error) { return scanAggregate(row) })
		return err
	})
	if err != nil {
		return WaitingReport{}, fmt.Errorf("inbox: waiting aggregates of schema %s: %w", a.schema.Name(), err)
	}
	return rep, nil
}

// GaugesMaxConsumers bounds the consumers Admin.Gauges reports.
const GaugesMaxConsumers = 1000

// Gauges returns, for every consumer that has a high-water mark in the
// schema (at most GaugesMaxConsumers, in name order), its aggregates
// waiting on a gap and the oldest wait's age, 0 for a consumer with none, so
// that its series exist while it is healthy. It walks the distinct consumer
// names on the primary key (one index probe per consumer) and counts the
// waiting rows on the partial index: its cost grows with the consumers and
// the waits, not with the aggregates.
func (a *Admin) Gauges(ctx context.Context) ([]ConsumerWaiting, error) {
	rows, err := a.db.Query(ctx, `WITH RECURSIVE c AS (
	(SELECT consumer_name FROM `+a.marks+` ORDER BY consumer_name LIMIT 1)
	UNION ALL
	SELECT (SELECT m.consumer_name FROM `+a.marks+` m WHERE m.consumer_name > c.consumer_name ORDER BY m.consumer_name LIMIT 1)
	FROM c WHERE c.consumer_name IS NOT NULL
)
SELECT c.consumer_name, w.n, w.oldest
FROM (SELECT consumer_name FROM c WHERE consumer_name IS NOT NULL LIMIT $1) c
CROSS JOIN LATERAL (SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(m.waiting_since)), 0)::float8 AS oldest
	FROM `+a.marks+` m WHERE m.consumer_name = c.consumer_name AND m.waiting_since IS NOT NULL) w
ORDER BY c.consumer_name`, GaugesMaxConsumers)
	if err != nil {
		return nil, fmt.Errorf("inbox: gauges of schema %s: %w", a.schema.Name(), err)
	}
	out, err := pgtx.Collect(rows, func(row pgtx.Row) (ConsumerWaiting, error) {
		var c ConsumerWaiting
		return c, row.Scan(&c.Consumer, &c.Waiting, &c.OldestWaitSeconds)
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: gauges of schema %s: %w", a.schema.Name(), err)
	}
	return out, nil
}

// Resolution says which aggregate Admin.Resolve moves past a gap, to where,
// who does it and why.
type Resolution struct {
	// Consumer, AggregateType and AggregateID name the consumer's aggregate.
	// Required.
	Consumer      string
	AggregateType string
	AggregateID   string
	// To is the high-water mark to set: the events up to To count as
	// applied, and To+1 is the next one applied. Zero means "just past the
	// gap": the lowest sequence seen while waiting, minus one, so that the
	// event that waits is applied at its next delivery (the aggregate must
	// be waiting). A To at or below the current mark is refused
	// (ErrMarkAhead); a To for an aggregate the consumer never saw creates
	// its mark.
	To int64
	// By names who resolves; Reason says why. Both required, recorded on
	// the mark row and in the audit log.
	By     string
	Reason string
}

// Resolve moves a consumer's high-water mark of an aggregate past a gap:
// the events between the mark and the new one will never be applied by that
// consumer (the broker lost them, or an operator decided so). It is recorded
// on the mark row (start_kind "resolved", start_prior_mark, start_mark,
// started_at, start_reason, start_by), ends the wait, and is written to the
// audit log (outbox_operations, action "inbox_resolve", with the wait it
// ended). It serialises with the consumer's deliveries of the aggregate on
// the mark row's lock. It returns the aggregate as resolved.
//
// The event that waited is not applied by Resolve: the broker redelivers it
// (it was negatively acknowledged as Early), and the inbox applies it then.
func (a *Admin) Resolve(ctx context.Context, r Resolution) (AggregateInfo, error) {
	what := fmt.Sprintf("consumer %s, aggregate %s/%s", r.Consumer, r.AggregateType, r.AggregateID)
	switch {
	case r.Consumer == "" || r.AggregateType == "" || r.AggregateID == "":
		return AggregateInfo{}, errors.New("inbox: resolve: the consumer, aggregate type and aggregate id are required")
	case r.To < 0:
		return AggregateInfo{}, fmt.Errorf("inbox: resolve %s: target mark %d is negative", what, r.To)
	case r.Reason == "":
		return AggregateInfo{}, fmt.Errorf("inbox: resolve %s: %w", what, ErrReasonRequired)
	case r.By == "":
		return AggregateInfo{}, fmt.Errorf("inbox: resolve %s: %w", what, ErrActorRequired)
	}
	var out AggregateInfo
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		if r.To > 0 {
			// Create the mark of an aggregate never seen, so that it can be
			// set explicitly; rolled back with the rest on refusal.
			if _, err := lockMark(ctx, tx, a.lockMark, r.Consumer, r.AggregateType, r.AggregateID); err != nil {
				return err
			}
		}
		before, err := scanAggregate(tx.QueryRow(ctx, `SELECT `+aggregateColumns+` FROM `+a.marks+`
WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE`, r.Consumer, r.AggregateType, r.AggregateID))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w (nor a wait; give a target mark to set one)", ErrAggregateNotFound)
		}
		if err != nil {
			return err
		}
		to := r.To
		if to == 0 {
			if before.Wait == nil {
				return fmt.Errorf("%w (its mark is %d; give a target mark to move it anyway)", ErrNotWaiting, before.LastSequence)
			}
			to = before.Wait.Seen - 1
		}
		if to <= before.LastSequence {
			return fmt.Errorf("%w: the mark is %d, the target %d", ErrMarkAhead, before.LastSequence, to)
		}
		out, err = scanAggregate(tx.QueryRow(ctx, `UPDATE `+a.marks+`
SET last_sequence = $4, updated_at = now(), waiting_since = NULL, waiting_for = NULL, waiting_seen = NULL,
	start_kind = 'resolved', start_prior_mark = last_sequence, start_mark = $4, started_at = now(), start_reason = $5, start_by = $6
WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3
RETURNING `+aggregateColumns, r.Consumer, r.AggregateType, r.AggregateID, to, r.Reason, r.By))
		if err != nil {
			return err
		}
		detail := map[string]any{"consumer": r.Consumer, "aggregate_type": r.AggregateType, "aggregate_id": r.AggregateID,
			"prior_mark": before.LastSequence, "mark": to}
		if w := before.Wait; w != nil {
			detail["waiting_since"], detail["waiting_for"], detail["waiting_seen"] = w.Since, w.Expected, w.Seen
		}
		b, err := json.Marshal(detail)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+a.operations+` (action, actor, reason, detail) VALUES ('inbox_resolve', $1, $2, $3::text::jsonb)`,
			r.By, r.Reason, string(b))
		return err
	})
	if err != nil {
		return AggregateInfo{}, fmt.Errorf("inbox: resolve %s: %w", what, err)
	}
	return out, nil
}
