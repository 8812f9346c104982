package sideeffect

import (
	"context"
	"database/sql"
	"encoding/hex"
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

// Errors of the operator API.
var (
	// ErrReasonRequired, ErrActorRequired: an operator action needs why and
	// who.
	ErrReasonRequired = errors.New("a reason is required")
	ErrActorRequired  = errors.New("an operator action needs who does it")
	// ErrFinal: the attempt is Succeeded or Failed already.
	ErrFinal = errors.New("the attempt's outcome is final already")
)

// AdminConfig configures an Admin.
type AdminConfig struct {
	// Schema is the PostgreSQL schema holding the side_effects table, as a
	// plain string: the older field, kept working; prefer Tables. Defaults
	// to "outbox".
	Schema string
	// Tables is the schema holding the side_effects table: the one outbox.Schema value
	// an application gives every component's config. Setting it and Schema
	// to different names is refused (outbox.ErrSchemaConflict). Defaults to
	// Schema, then "outbox".
	Tables outbox.Schema
}

// Admin is the operator's API over the side-effect attempts of a schema, for
// every name: what `outbox status` shows and package outboxprom samples,
// and the resolution of parked attempts. It is safe for concurrent use.
type Admin struct {
	db            pgtx.DB
	schema        pgident.Schema
	t, ops, waits string
}

// NewAdmin returns an Admin over pool.
func NewAdmin(pool *pgxpool.Pool, cfg AdminConfig) (*Admin, error) {
	if pool == nil {
		return nil, errors.New("sideeffect: NewAdmin needs a pool")
	}
	return newAdmin(pgtx.Pool(pool), cfg)
}

// NewSQLAdmin returns an Admin over db, a database/sql database (sqlx,
// GORM, bun, ent): the same Admin as NewAdmin's, over database/sql.
func NewSQLAdmin(db *sql.DB, cfg AdminConfig) (*Admin, error) {
	if db == nil {
		return nil, errors.New("sideeffect: NewSQLAdmin needs a database")
	}
	return newAdmin(pgtx.Database(db), cfg)
}

func newAdmin(db pgtx.DB, cfg AdminConfig) (*Admin, error) {
	s, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: admin: %w", err)
	}
	return &Admin{db: db, schema: s, t: s.Table("side_effects"), ops: s.Table("outbox_operations"), waits: s.Table("side_effect_waits")}, nil
}

// Schema is the schema the Admin works on.
func (a *Admin) Schema() string { return a.schema.Name() }

// Exists reports whether the schema has the side_effects table (outboxmigrate
// version 7 or later).
func (a *Admin) Exists(ctx context.Context) (bool, error) {
	var ok bool
	err := a.db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, a.t).Scan(&ok)
	return ok, err
}

// Operator is the last operator action on an attempt.
type Operator struct {
	At     time.Time `json:"at"`
	By     string    `json:"by"`
	Reason string    `json:"reason"`
}

// Attempt is one recorded attempt, as the operator sees it.
type Attempt struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	Mode string `json:"mode"`
	// State is as stored; Expired is set for a started attempt whose lease
	// expired (it counts as unknown).
	State   State `json:"state"`
	Expired bool  `json:"expired,omitempty"`
	// Fingerprint is the request's sha256, in hex.
	Fingerprint string `json:"fingerprint"`
	// Response is the provider's response (base64 in JSON).
	Response     []byte     `json:"response,omitempty"`
	Attempts     int        `json:"attempts"`
	Checks       int        `json:"checks"`
	BlindRetries int        `json:"blind_retries"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	LastAttempt  *time.Time `json:"last_attempt_at,omitempty"`
	UnknownSince *time.Time `json:"unknown_since,omitempty"`
	NextCheck    *time.Time `json:"next_check_at,omitempty"`
	LeaseUntil   *time.Time `json:"lease_until,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
	Via          string     `json:"resolved_via,omitempty"`
	ParkedAt     *time.Time `json:"parked_at,omitempty"`
	ParkReason   string     `json:"park_reason,omitempty"`
	// OperatorRetry: an operator let the next Do call again.
	OperatorRetry bool      `json:"operator_retry,omitempty"`
	Operator      *Operator `json:"operator,omitempty"`
}

const attemptColumns = `name, key, mode, state, coalesce(state = 'started' AND lease_until <= now(), false), fingerprint, response,
	attempts, checks, blind_retries, created_at, updated_at, last_attempt_at, unknown_since, next_check_at, lease_until,
	coalesce(last_error, ''), coalesce(resolved_via, ''), parked_at, coalesce(park_reason, ''), operator_retry,
	operator_at, coalesce(operator_by, ''), coalesce(operator_reason, '')`

func scanAttempt(row pgtx.Row) (Attempt, error) {
	var at Attempt
	var fp []byte
	var opAt *time.Time
	var op Operator
	err := row.Scan(&at.Name, &at.Key, &at.Mode, &at.State, &at.Expired, &fp, &at.Response,
		&at.Attempts, &at.Checks, &at.BlindRetries, &at.CreatedAt, &at.UpdatedAt, &at.LastAttempt, &at.UnknownSince, &at.NextCheck, &at.LeaseUntil,
		&at.LastError, &at.Via, &at.ParkedAt, &at.ParkReason, &at.OperatorRetry, &opAt, &op.By, &op.Reason)
	if err != nil {
		return at, err
	}
	at.Fingerprint = hex.EncodeToString(fp)
	at.CreatedAt, at.UpdatedAt = at.CreatedAt.UTC(), at.UpdatedAt.UTC()
	for _, t := range []**time.Time{&at.LastAttempt, &at.UnknownSince, &at.NextCheck, &at.LeaseUntil, &at.ParkedAt} {
		if *t != nil {
			u := (*t).UTC()
			*t = &u
		}
	}
	if opAt != nil {
		op.At = opAt.UTC()
		at.Operator = &op
	}
	return at, nil
}

// Attempt returns the attempt of name and key, or ErrNotFound.
func (a *Admin) Attempt(ctx context.Context, name, key string) (Attempt, error) {
	at, err := scanAttempt(a.db.QueryRow(ctx, `SELECT `+attemptColumns+` FROM `+a.t+` WHERE name = $1 AND key = $2`, name, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Attempt{}, fmt.Errorf("sideeffect %s, key %s: %w", name, key, ErrNotFound)
	}
	if err != nil {
		return Attempt{}, fmt.Errorf("sideeffect %s, key %s: %w", name, key, err)
	}
	return at, nil
}

// Gauges is what is open for one name: the figures a dashboard and an alert
// need.
type Gauges struct {
	Name string `json:"name"`
	// Started counts attempts under a live claim (a call or a lookup under
	// way); Unknown those whose outcome is unknown, started ones whose lease
	// expired included; Parked those waiting for an operator.
	Started int64 `json:"started"`
	Unknown int64 `json:"unknown"`
	Parked  int64 `json:"parked"`
	// OldestUnknownAgeSeconds is how long the oldest unknown attempt has
	// been so, 0 when none is.
	OldestUnknownAgeSeconds float64 `json:"oldest_unknown_age_seconds"`
}

// GaugesMaxNames bounds the names Admin.Gauges reports.
const GaugesMaxNames = 1000

// Gauges returns, for every name with an attempt in the schema (at most
// GaugesMaxNames, in name order), its open attempts, 0 for a name with none
// so that its series exist while it is healthy. It walks the distinct names
// on the primary key and counts on the partial indexes of open and parked
// attempts: its cost grows with the names and the open attempts, not with
// the finished ones.
func (a *Admin) Gauges(ctx context.Context) ([]Gauges, error) {
	rows, err := a.db.Query(ctx, `WITH RECURSIVE n AS (
	(SELECT name FROM `+a.t+` ORDER BY name LIMIT 1)
	UNION ALL
	SELECT (SELECT s.name FROM `+a.t+` s WHERE s.name > n.name ORDER BY s.name LIMIT 1)
	FROM n WHERE n.name IS NOT NULL
)
SELECT n.name, o.started, o.unknown, o.oldest, p.parked
FROM (SELECT name FROM n WHERE name IS NOT NULL LIMIT $1) n
CROSS JOIN LATERAL (
	SELECT count(*) FILTER (WHERE s.state = 'started' AND s.lease_until > now()) AS started,
		count(*) FILTER (WHERE NOT (s.state = 'started' AND s.lease_until > now())) AS unknown,
		coalesce(extract(epoch FROM now() - min(coalesce(s.unknown_since, s.lease_until))
			FILTER (WHERE NOT (s.state = 'started' AND s.lease_until > now()))), 0)::float8 AS oldest
	FROM `+a.t+` s WHERE s.name = n.name AND s.state IN ('started', 'unknown')) o
CROSS JOIN LATERAL (SELECT count(*) AS parked FROM `+a.t+` s WHERE s.name = n.name AND s.state = 'parked') p
ORDER BY n.name`, GaugesMaxNames)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: gauges of schema %s: %w", a.schema.Name(), err)
	}
	out, err := pgtx.Collect(rows, func(row pgtx.Row) (Gauges, error) {
		var g Gauges
		return g, row.Scan(&g.Name, &g.Started, &g.Unknown, &g.OldestUnknownAgeSeconds, &g.Parked)
	})
	if err != nil {
		return nil, fmt.Errorf("sideeffect: gauges of schema %s: %w", a.schema.Name(), err)
	}
	return out, nil
}

// Cursor is where a page of parked attempts ends; pass it as
// ParkedFilter.After for the next page.
type Cursor struct {
	ParkedAt time.Time `json:"parked_at"`
	Name     string    `json:"name"`
	Key      string    `json:"key"`
}

// ParkedFilter narrows Admin.Parked.
type ParkedFilter struct {
	// Name, when set, restricts the list to that name.
	Name string
	// Limit is the most attempts listed. Defaults to 100.
	Limit int
	// After, when set, starts after that attempt (the previous page's Next).
	After *Cursor
}

// ParkedPage is one page of parked attempts, oldest park first.
type ParkedPage struct {
	Attempts []Attempt `json:"attempts"`
	// Next is set when more follow.
	Next *Cursor `json:"next,omitempty"`
}

// Parked lists parked attempts, oldest park first, a page at a time (read
// on the partial index of parked attempts).
func (a *Admin) Parked(ctx context.Context, f ParkedFilter) (ParkedPage, error) {
	if f.Limit < 0 {
		return ParkedPage{}, fmt.Errorf("sideeffect: parked: limit %d is negative", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	after := Cursor{ParkedAt: time.Unix(0, 0)}
	if f.After != nil {
		after = *f.After
	}
	rows, err := a.db.Query(ctx, `SELECT `+attemptColumns+` FROM `+a.t+`
WHERE state = 'parked' AND ($1 = '' OR name = $1) AND (parked_at, name, key) > ($2, $3, $4)
ORDER BY parked_at, name, key
LIMIT $5`, f.Name, after.ParkedAt, after.Name, after.Key, f.Limit+1)
	if err != nil {
		return ParkedPage{}, fmt.Errorf("sideeffect: parked attempts of schema %s: %w", a.schema.Name(), err)
	}
	list, err := pgtx.Collect(rows, func(row pgtx.Row) (Attempt, error) { return scanAttempt(row) })
	if err != nil {
		return ParkedPage{}, fmt.Errorf("sideeffect: parked attempts of schema %s: %w", a.schema.Name(), err)
	}
	page := ParkedPage{Attempts: list}
	if len(list) > f.Limit {
		page.Attempts = list[:f.Limit]
		last := page.Attempts[f.Limit-1]
		page.Next = &Cursor{ParkedAt: *last.ParkedAt, Name: last.Name, Key: last.Key}
	}
	return page, nil
}

// NameStatus counts one name's attempts by state.
type NameStatus struct {
	Gauges
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	// BlindRetries sums the calls made again without knowing whether the
	// earlier one took effect (mode neither): each a possible duplicate.
	BlindRetries int64 `json:"blind_retries"`
}

// Status is what `outbox status` shows of the side effects of a schema.
type Status struct {
	Schema string    `json:"schema"`
	At     time.Time `json:"at"`
	// Names counts, per name, the attempts by state.
	Names []NameStatus `json:"names"`
	// Parked is the first page of parked attempts, oldest first.
	Parked ParkedPage `json:"parked"`
}

// Status counts every name's attempts by state and lists the oldest parked
// ones (at most parkedLimit; 0 means 100). Unlike Gauges it counts the
// finished attempts too, reading the whole table.
func (a *Admin) Status(ctx context.Context, parkedLimit int) (Status, error) {
	st := Status{Schema: a.schema.Name(), Names: []NameStatus{}}
	gauges, err := a.Gauges(ctx)
	if err != nil {
		return st, err
	}
	byName := map[string]NameStatus{}
	rows, err := a.db.Query(ctx, `SELECT name, now(), count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE state = 'failed'),
	coalesce(sum(blind_retries), 0)
FROM `+a.t+` GROUP BY name ORDER BY name`)
	if err != nil {
		return st, fmt.Errorf("sideeffect: status of schema %s: %w", a.schema.Name(), err)
	}
	for rows.Next() {
		var ns NameStatus
		if err := rows.Scan(&ns.Name, &st.At, &ns.Succeeded, &ns.Failed, &ns.BlindRetries); err != nil {
			rows.Close()
			return st, fmt.Errorf("sideeffect: status of schema %s: %w", a.schema.Name(), err)
		}
		byName[ns.Name] = ns
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("sideeffect: status of schema %s: %w", a.schema.Name(), err)
	}
	for _, g := range gauges {
		ns := byName[g.Name]
		ns.Gauges = g
		st.Names = append(st.Names, ns)
	}
	if st.At.IsZero() {
		if err := a.db.QueryRow(ctx, `SELECT now()`).Scan(&st.At); err != nil {
			return st, err
		}
	}
	st.At = st.At.UTC()
	if st.Parked, err = a.Parked(ctx, ParkedFilter{Limit: parkedLimit}); err != nil {
		return st, err
	}
	return st, nil
}

// ResolveAs says how an operator settles an attempt.
type ResolveAs string

const (
	// ResolveSucceeded: the effect happened (the operator checked with the
	// provider); the attempt becomes Succeeded, with Resolution.Response
	// when given.
	ResolveSucceeded ResolveAs = "succeeded"
	// ResolveFailed: the effect did not happen and must not be retried; the
	// attempt becomes Failed.
	ResolveFailed ResolveAs = "failed"
	// ResolveRetry: let the next Do call again, with the same key, whatever
	// the mode (in mode Neither a possible duplicate, counted as a blind
	// retry) and afresh within the bound; a Lookup still runs first.
	ResolveRetry ResolveAs = "retry"
)

// Resolution names an attempt, how to settle it, who does and why.
type Resolution struct {
	Name, Key string
	As        ResolveAs
	// Response is recorded for ResolveSucceeded and ResolveFailed, when set.
	Response []byte
	// By and Reason are required, recorded on the attempt and in the audit
	// log.
	By, Reason string
}

// Resolve settles a parked or unknown attempt (or a started one whose lease
// expired) as an operator decided; a finished attempt is refused
// (ErrFinal), one under a live claim too (ErrInProgress). It is recorded on
// the attempt (operator_at, operator_by, operator_reason) and in the audit
// log (outbox_operations, action "sideeffect_resolve"). It returns the
// attempt as resolved.
func (a *Admin) Resolve(ctx context.Context, r Resolution) (Attempt, error) {
	what := fmt.Sprintf("sideeffect %s, key %s", r.Name, r.Key)
	switch {
	case r.Name == "" || r.Key == "":
		return Attempt{}, errors.New("sideeffect: resolve: the name and key are required")
	case r.As != ResolveSucceeded && r.As != ResolveFailed && r.As != ResolveRetry:
		return Attempt{}, fmt.Errorf("%s: resolve as %q: use succeeded, failed or retry", what, r.As)
	case r.Reason == "":
		return Attempt{}, fmt.Errorf("%s: %w", what, ErrReasonRequired)
	case r.By == "":
		return Attempt{}, fmt.Errorf("%s: %w", what, ErrActorRequired)
	}
	var out Attempt
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		before, err := scanAttempt(tx.QueryRow(ctx, `SELECT `+attemptColumns+` FROM `+a.t+` WHERE name = $1 AND key = $2 FOR UPDATE`, r.Name, r.Key))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		switch {
		case before.State == Succeeded || before.State == Failed:
			return fmt.Errorf("%w (%s)", ErrFinal, before.State)
		case before.State == Started && !before.Expired:
			return ErrInProgress
		}
		const common = `lease_token = lease_token + 1, lease_until = NULL, updated_at = now(),
	operator_at = now(), operator_by = $3, operator_reason = $4`
		var sql string
		args := []any{r.Name, r.Key, r.By, r.Reason}
		if r.As == ResolveRetry {
			sql = `UPDATE ` + a.t + ` SET state = 'unknown', operator_retry = true, checks = 0, unknown_since = now(), next_check_at = now(), ` + common
		} else {
			sql = `UPDATE ` + a.t + ` SET state = $5, response = coalesce($6, response), resolved_via = 'operator', next_check_at = NULL, ` + common
			args = append(args, string(r.As), r.Response)
		}
		out, err = scanAttempt(tx.QueryRow(ctx, sql+` WHERE name = $1 AND key = $2 RETURNING `+attemptColumns, args...))
		if err != nil {
			return err
		}
		detail := map[string]any{"name": r.Name, "key": r.Key, "from": before.State, "to": string(r.As),
			"attempts": before.Attempts, "checks": before.Checks}
		if before.ParkReason != "" {
			detail["park_reason"] = before.ParkReason
		}
		b, err := json.Marshal(detail)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+a.ops+` (action, actor, reason, detail) VALUES ('sideeffect_resolve', $1, $2, $3::text::jsonb)`, r.By, r.Reason, string(b))
		return err
	})
	if err != nil {
		return Attempt{}, fmt.Errorf("%s: resolve: %w", what, err)
	}
	return out, nil
}

// WaitingEvent is a consumer's event waiting on an attempt (Caller.WaitTx),
// to be run again by the consumer's Resume once the attempt is resolved.
type WaitingEvent struct {
	Consumer string `json:"consumer"`
	EventID  string `json:"event_id"`
	// Name and Key are the attempt it waits on.
	Name          string    `json:"name"`
	Key           string    `json:"key"`
	EventType     string    `json:"event_type"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Sequence      int64     `json:"sequence"`
	Since         time.Time `json:"waiting_since"`
	// Wakes counts the handler's runs for it; LastError is the last run's
	// error, if it failed.
	Wakes     int    `json:"wakes"`
	LastError string `json:"last_error,omitempty"`
}

// WaitingMax bounds the events Admin.Waiting lists.
const WaitingMax = 100

// Waiting lists the events waiting on the attempt of name and key (at most
// WaitingMax, longest waiting first): what resolving it wakes. A schema
// without the side_effect_waits table (before migration 16) has none.
// Admin.Waits lists the events waiting on any attempt, a page at a time.
func (a *Admin) Waiting(ctx context.Context, name, key string) ([]WaitingEvent, error) {
	rows, err := a.db.Query(ctx, `SELECT `+waitingColumns+`
FROM `+a.waits+` WHERE name = $1 AND key = $2
ORDER BY waiting_since, consumer_name, event_id
LIMIT $3`, name, key, WaitingMax)
	var out []WaitingEvent
	if err == nil {
		out, err = pgtx.Collect(rows, scanWaiting)
	}
	if undefinedTable(err) { // before migration 16
		return []WaitingEvent{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sideeffect %s, key %s: events waiting: %w", name, key, err)
	}
	return out, nil
}
