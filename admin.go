package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Errors of the operator API. They are wrapped with the event id.
var (
	// ErrEventNotFound: no event has that id (it never existed, or clean-up
	// deleted it).
	ErrEventNotFound = errors.New("no such event")
	// ErrNotQuarantined: the event is not quarantined, so it cannot be
	// retried or skipped (it is pending, in flight, published or skipped).
	ErrNotQuarantined = errors.New("event is not quarantined")
	// ErrReasonRequired: a skip without a reason was refused.
	ErrReasonRequired = errors.New("a skip needs a reason")
	// ErrActorRequired: an operator action without who does it was refused.
	ErrActorRequired = errors.New("an operator action needs who does it")
	// ErrNotLaneHead: a skip of a quarantined event that is not its
	// aggregate's first unsettled event was refused. Skipping it would mark
	// it settled while an earlier event is not, and the relay would then
	// publish the events after it before that earlier one (I5). The error
	// names the earlier event; settle it first (retry or skip it, or wait
	// until the relay publishes it).
	ErrNotLaneHead = errors.New("an earlier event of its aggregate is not settled yet")
	// ErrQuarantineChanged: RetrySeen or SkipSeen was refused because the
	// event is quarantined, but not since the time the operator saw: it was
	// retried and quarantined again meanwhile.
	ErrQuarantineChanged = errors.New("event was quarantined again since it was seen")
)

// AdminConfig configures an Admin.
type AdminConfig struct {
	// Schema is the PostgreSQL schema holding the outbox tables, as a plain
	// string: the older field, kept working; prefer Tables. Defaults to
	// "outbox".
	Schema string
	// Tables is the schema holding the outbox tables: the one Schema value an
	// application gives every component's config (see outbox.Schema). Setting
	// it and Schema to different names is refused (ErrSchemaConflict).
	// Defaults to Schema, then "outbox".
	Tables Schema
	// Observer receives clean-up measurements (a CleanupObserver, such as
	// outboxprom.Metrics). Optional.
	Observer CleanupObserver
}

// Admin is the operator's API: what `outbox status`, `outbox quarantine`,
// `outbox replay` and `outbox cleanup` run. It answers "is it healthy, what
// is stuck, why" (Status, ListQuarantined) and unsticks (Retry, Skip),
// replays (Replay) and cleans up (Cleanup). It is safe for concurrent use.
//
// It needs the schema at migration version 11 or later (Cleanup and Replay
// call functions that migration installs).
type Admin struct {
	db     pgtx.DB
	schema pgident.Schema
	obs    CleanupObserver
	t      adminTables
}

type adminTables struct {
	events, relays, operations, migrations string
}

// NewAdmin returns an Admin over pool.
func NewAdmin(pool *pgxpool.Pool, cfg AdminConfig) (*Admin, error) {
	if pool == nil {
		return nil, errors.New("outbox: NewAdmin needs a pool")
	}
	return newAdmin(pgtx.Pool(pool), cfg)
}

// NewSQLAdmin returns an Admin over db, a database/sql database (the one
// sqlx, GORM, bun or ent hand out, over any PostgreSQL driver). It is the
// same Admin as NewAdmin's: the same statements, results and errors; its
// transactions are database/sql ones.
func NewSQLAdmin(db *sql.DB, cfg AdminConfig) (*Admin, error) {
	if db == nil {
		return nil, errors.New("outbox: NewSQLAdmin needs a database")
	}
	return newAdmin(pgtx.Database(db), cfg)
}

func newAdmin(db pgtx.DB, cfg AdminConfig) (*Admin, error) {
	s, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: admin: %w", err)
	}
	return &Admin{db: db, schema: s, obs: cfg.Observer, t: adminTables{
		events:     s.Table("outbox_events"),
		relays:     s.Table("outbox_relays"),
		operations: s.Table("outbox_operations"),
		migrations: s.Table("outbox_schema_migrations"),
	}}, nil
}

// Schema is the schema the Admin works on.
func (a *Admin) Schema() string { return a.schema.Name() }

// Status is a snapshot of the outbox, taken by Admin.Status. Counts and ages
// are by the database's clock at At.
type Status struct {
	// Schema is the schema the snapshot is of.
	Schema string `json:"schema"`
	// MigrationVersion is the highest migration applied to it.
	MigrationVersion int `json:"migration_version"`
	// At is the database's clock when the snapshot was taken.
	At time.Time `json:"at"`
	// Backlog counts the unsettled events of every aggregate type.
	Backlog
	// PublishedLastMinute counts events published (not skipped) in the
	// minute before At.
	PublishedLastMinute int64 `json:"published_last_minute"`
	// BlockedByQuarantine counts pending events waiting behind a
	// quarantined event of their aggregate.
	BlockedByQuarantine int64 `json:"blocked_by_quarantine"`
	// AggregateTypes breaks the backlog down by aggregate type (types with
	// nothing pending and nothing published in the last minute are left
	// out).
	AggregateTypes []AggregateTypeStatus `json:"aggregate_types"`
	// RelaysAlive counts relays whose heartbeat has not expired (and is
	// believed: see RelayInfo.Untrusted).
	RelaysAlive int `json:"relays_alive"`
	// Relays are the heartbeat rows, alive or expired (pruned an hour after).
	Relays []RelayInfo `json:"relays"`
	// Tables and Indexes are the sizes of the outbox's own tables.
	Tables  []TableSize `json:"tables"`
	Indexes []IndexSize `json:"indexes"`
	// RecentOperations are the last operator actions (retry, skip,
	// replay), newest first.
	RecentOperations []Operation `json:"recent_operations"`
	// Partitions describes a partitioned outbox_events
	// (outboxmigrate.Partition); nil when the table is not partitioned.
	Partitions *PartitionsStatus `json:"partitions,omitempty"`
}

// PartitionsStatus describes the partitions of a partitioned outbox_events.
type PartitionsStatus struct {
	// IntervalSeconds is the width of the newest partition, the width the
	// upkeep gives the next ones.
	IntervalSeconds float64 `json:"interval_seconds"`
	// ReadyUntil is the end of the newest partition: an event whose id
	// (a UUIDv7) holds a later time is refused (ErrNoPartition). The
	// relay's upkeep keeps it RelayConfig.PartitionsAhead intervals ahead;
	// alert when it is less than two intervals away (no upkeep runs).
	ReadyUntil time.Time `json:"ready_until"`
	// Partitions are the partitions, oldest first.
	Partitions []PartitionStatus `json:"partitions"`
}

// PartitionStatus is one partition of a partitioned outbox_events.
type PartitionStatus struct {
	// Name is the partition's table.
	Name string `json:"name"`
	// From and To bound the time its event ids hold (To excluded).
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Rows is the planner's estimate, -1 when never analysed.
	Rows int64 `json:"rows_estimate"`
	// TotalBytes is its size, indexes and TOAST included.
	TotalBytes int64 `json:"total_bytes"`
	// DetachPending is true while an interrupted DETACH ... CONCURRENTLY
	// of it waits for the upkeep's next round (FINALIZE). outbox_events no
	// longer shows its events: they are read from its own table, and its
	// unpublished ones are counted in Status.Pending and Quarantined.
	DetachPending bool `json:"detach_pending,omitempty"`
	// Detached is true for a table an upkeep round detached and neither
	// dropped nor attached again (it failed in between): the next round
	// attaches it again, or drops it when its events are all settled and
	// past the horizon. Its events are read and counted as for
	// DetachPending.
	Detached bool `json:"detached,omitempty"`
	// Unreadable is true when its events could not be read (DetachPending
	// or Detached, and the role has no SELECT on its own table): the
	// counts are unknown.
	Unreadable bool `json:"unreadable,omitempty"`
	// Closed is true once To is past: no id being made now falls in it.
	// The counts below are read for closed partitions only.
	Closed bool `json:"closed"`
	// Unpublished counts its events neither published nor skipped (up to
	// 100,000); Quarantined those of them quarantined.
	Unpublished int64 `json:"unpublished"`
	Quarantined int64 `json:"quarantined"`
	// SkipMarkers counts its skipped events that a later event of their
	// aggregate, not yet written or in a later partition, still needs.
	SkipMarkers int64 `json:"skip_markers"`
	// LastPublished is the latest publish (or skip) of its events; a
	// closed partition with nothing else holding it is dropped once this
	// is older than the replay horizon (the relay's Cleanup.OlderThan).
	LastPublished *time.Time `json:"last_published,omitempty"`
	// Held says why a closed partition stays, whatever the horizon:
	// unpublished or quarantined events, or skip markers. "" when only
	// the horizon keeps it.
	Held string `json:"held,omitempty"`
}

func partitionStatus(p partman.Partition, h partman.Hold, why string) PartitionStatus {
	ps := PartitionStatus{Name: p.Name, From: p.From, To: p.To, DetachPending: p.DetachPending, Detached: p.Detached, Closed: true,
		Unpublished: h.Unpublished, Quarantined: h.Quarantined, SkipMarkers: h.SkipMarkers, Held: why, Rows: -1}
	if !h.LastPublished.IsZero() {
		t := h.LastPublished.UTC()
		ps.LastPublished = &t
	}
	return ps
}

// partitions reads the partitions of a partitioned outbox_events; nil
// when it is not.
func (a *Admin) partitions(ctx context.Context, q pgtx.Querier, now time.Time) (*PartitionsStatus, error) {
	parted, err := partman.IsPartitioned(ctx, q, a.schema)
	if err != nil || !parted {
		return nil, err
	}
	parts, err := partman.List(ctx, q, a.schema)
	if err != nil {
		return nil, err
	}
	out := &PartitionsStatus{IntervalSeconds: partman.Interval(parts).Seconds()}
	if len(parts) > 0 {
		out.ReadyUntil = parts[len(parts)-1].To
	}
	left, err := partman.Leftovers(ctx, q, a.schema)
	if err != nil {
		return nil, err
	}
	for _, p := range append(parts, left...) {
		ps := PartitionStatus{Name: p.Name, From: p.From, To: p.To, DetachPending: p.DetachPending, Detached: p.Detached}
		switch {
		case p.DetachPending || p.Detached:
			// outbox_events does not show its events: read its table.
			ok, err := partman.CanRead(ctx, q, a.schema, p)
			if err != nil {
				return nil, err
			}
			if !ok {
				ps.Unreadable, ps.Closed = true, !p.To.After(now)
				ps.Held = "detach unfinished; this role cannot read its table"
				break
			}
			h, err := partman.CheckTable(ctx, q, a.schema, p)
			if err != nil {
				return nil, err
			}
			ps = partitionStatus(p, h, h.Reason(now))
			ps.Closed = !p.To.After(now)
		case !p.To.After(now):
			h, err := partman.Check(ctx, q, a.schema, p)
			if err != nil {
				return nil, err
			}
			ps = partitionStatus(p, h, h.Reason(now))
		}
		// A partition dropped meanwhile reads as empty.
		if err := q.QueryRow(ctx, `SELECT coalesce(max(c.reltuples), -1)::bigint, coalesce(max(pg_total_relation_size(c.oid)), 0)
FROM pg_class c WHERE c.oid = to_regclass($1)`, a.schema.Table(p.Name)).Scan(&ps.Rows, &ps.TotalBytes); err != nil {
			return nil, fmt.Errorf("read the size of partition %s: %w", p.Name, err)
		}
		out.Partitions = append(out.Partitions, ps)
	}
	return out, nil
}

// Backlog counts the unsettled events (published_at IS NULL).
type Backlog struct {
	// Pending counts unpublished events that are not quarantined (waiting,
	// backing off, or in flight).
	Pending int64 `json:"pending"`
	// Retrying counts pending events that failed at least once.
	Retrying int64 `json:"retrying"`
	// Leased counts events under a live lease (being published).
	Leased int64 `json:"leased"`
	// ExpiredLeases counts events whose lease expired before their relay
	// settled them (a relay died or stalled); another relay takes them over.
	ExpiredLeases int64 `json:"expired_leases"`
	// Quarantined counts quarantined events.
	Quarantined int64 `json:"quarantined"`
	// OldestPendingAgeSeconds is the age of the oldest pending event
	// (since its occurred_at), 0 when none is pending.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// OldestUnparkedAgeSeconds is the same without the events parked
	// behind a quarantined one (counted by BlockedByQuarantine): how long
	// the relays have left an event they could publish.
	OldestUnparkedAgeSeconds float64 `json:"oldest_unparked_age_seconds"`
	// OldestParkedAgeSeconds is the age of the oldest of those parked
	// events (blocked behind a quarantined one), 0 when none is.
	OldestParkedAgeSeconds float64 `json:"oldest_parked_age_seconds"`
}

// AggregateTypeStatus is the backlog of one aggregate type.
type AggregateTypeStatus struct {
	// AggregateType is the aggregate type; Backlog its unsettled events;
	// PublishedLastMinute its events published in the last minute.
	AggregateType string `json:"aggregate_type"`
	Backlog
	PublishedLastMinute int64 `json:"published_last_minute"`
}

// RelayInfo is a relay's heartbeat row.
type RelayInfo struct {
	// ID is the relay's claimed_by name; Hostname and PID where it runs.
	ID       string `json:"relay_id"`
	Hostname string `json:"hostname"`
	PID      int    `json:"pid"`
	// StartedAt is when it started; HeartbeatAt its last heartbeat;
	// ExpiresAt when it stops counting as alive without another one.
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	// Alive reports that the heartbeat has not expired, and is believed:
	// a heartbeat_at more than RelayClockSkew ahead of the database's
	// clock was not written by a relay's heartbeat (which takes the
	// database's now()), so that row is never alive; nor is a row whose
	// heartbeat_at is more than RelayHeartbeatLifetimeMax old, whatever
	// its expires_at.
	Alive bool `json:"alive"`
	// AckDurability is what the relay learnt at start about its
	// destination's acknowledgement (see DurabilityChecker); nil until it
	// recorded it, or when what it recorded is not a document this version
	// reads.
	AckDurability *AckDurability `json:"ack_durability,omitempty"`
	// Health is what the relay last recorded of its readiness, last error
	// and counts per minute (migration 015; see RelayHealth); nil until it
	// recorded it, or when what it recorded is not a document this version
	// reads (a relay of another version, a row written by hand), or when
	// it is over RelayNoteMaxBytes (not read).
	Health *RelayHealth `json:"health,omitempty"`
	// Untrusted, when set, says what of the row is not believed: a
	// heartbeat_at in the future (the row is not alive), a health or
	// ack_durability document over RelayNoteMaxBytes (left unread). The
	// relay role writes these rows; they are monitoring notes, not
	// evidence.
	Untrusted string `json:"untrusted,omitempty"`
}

// Bounds on what Admin.Status and Admin.History believe of a heartbeat row
// (outbox_relays), which the relay role writes.
const (
	// RelayClockSkew is how far ahead of the database's clock a relay's
	// heartbeat_at may be and still be believed. A relay's heartbeat takes
	// the database's now(), so any later one was written otherwise.
	RelayClockSkew = time.Minute
	// RelayHeartbeatLifetimeMax is how long after its heartbeat_at a
	// heartbeat row may count as alive, whatever its expires_at. A relay's
	// row lives three waits of its heartbeat, and RelayConfig caps
	// HeartbeatInterval and IdleBackoffMax at a third of this, so any
	// longer expires_at was not written by a relay's heartbeat: without the
	// bound, a row expiring a century ahead kept a relay that died counted
	// alive (and `status --check` content) for that long.
	RelayHeartbeatLifetimeMax = time.Hour
	// RelayNoteMaxBytes is the largest health or ack_durability document
	// read from a heartbeat row (a relay's health is a few kilobytes: an
	// hour of minutes and two error texts). A larger one is left unread,
	// as if not recorded, rather than fetched and parsed by every status
	// and console page.
	RelayNoteMaxBytes = 64 << 10
)

// TableSize is the size of one table.
type TableSize struct {
	// Table is the table's name.
	Table string `json:"table"`
	// Rows is the planner's estimate (pg_class.reltuples), -1 when the
	// table was never analysed.
	Rows int64 `json:"rows_estimate"`
	// HeapBytes is the table's main data; IndexBytes its indexes;
	// TotalBytes everything (TOAST included).
	HeapBytes  int64 `json:"heap_bytes"`
	IndexBytes int64 `json:"index_bytes"`
	TotalBytes int64 `json:"total_bytes"`
}

// IndexSize is the size of one index.
type IndexSize struct {
	// Index is the index's name, Table its table's, Bytes its size.
	Index string `json:"index"`
	Table string `json:"table"`
	Bytes int64  `json:"bytes"`
}

// Operation is one operator action from the audit log.
type Operation struct {
	// ID numbers the operations; At is when it happened.
	ID int64     `json:"operation_id"`
	At time.Time `json:"at"`
	// Action is "retry", "skip" or "replay"; Actor who did it.
	Action string `json:"action"`
	Actor  string `json:"actor"`
	// EventID is the event retried or skipped; nil for a replay.
	EventID *uuid.UUID `json:"event_id,omitempty"`
	// Reason is a skip's reason.
	Reason string `json:"reason,omitempty"`
	// Detail holds the rest: the event's aggregate and last error, a
	// replay's filters, count and outcome.
	Detail map[string]any `json:"detail,omitempty"`
}

// ownTables are the tables Status reports the sizes of.
var ownTables = []string{"outbox_events", "outbox_aggregates", "processed_events", "inbox_aggregates",
	"outbox_relays", "outbox_operations", "outbox_schema_migrations"}

// ownTablesList is ownTables as one comma-separated text parameter
// (string_to_array), which every driver passes, where a []string needs
// one that encodes arrays.
var ownTablesList = strings.Join(ownTables, ",")

// backlogColumns aggregates unsettled rows e into a Backlog.
const backlogColumns = `count(*) FILTER (WHERE e.quarantined_at IS NULL),
	count(*) FILTER (WHERE e.quarantined_at IS NULL AND e.attempt_count > 0),
	count(*) FILTER (WHERE e.claim_until >= now()),
	count(*) FILTER (WHERE e.claim_token IS NOT NULL AND e.claim_until < now()),
	count(*) FILTER (WHERE e.quarantined_at IS NOT NULL),
	coalesce(extract(epoch FROM now() - min(e.occurred_at) FILTER (WHERE e.quarantined_at IS NULL)), 0)::float8,
	coalesce(extract(epoch FROM now() - min(e.occurred_at) FILTER (WHERE e.quarantined_at IS NULL AND e.available_at < 'infinity')), 0)::float8,
	coalesce(extract(epoch FROM now() - min(e.occurred_at) FILTER (WHERE e.quarantined_at IS NULL AND e.available_at = 'infinity')), 0)::float8`

func (b *Backlog) scanArgs() []any {
	return []any{&b.Pending, &b.Retrying, &b.Leased, &b.ExpiredLeases, &b.Quarantined, &b.OldestPendingAgeSeconds, &b.OldestUnparkedAgeSeconds, &b.OldestParkedAgeSeconds}
}

// Status takes a snapshot. Its cost grows with the backlog (one pass over
// the unsettled rows, through the partial indexes) and with the events
// published in the last minute, never with the settled history kept.
func (a *Admin) Status(ctx context.Context) (Status, error) {
	st := Status{Schema: a.schema.Name()}
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{RepeatableRead: true, ReadOnly: true}, func(tx pgtx.Querier) error {
		if err := tx.QueryRow(ctx, `SELECT now(), coalesce((SELECT max(version) FROM `+a.t.migrations+`), 0)`).Scan(&st.At, &st.MigrationVersion); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		st.At = st.At.UTC()
		byType := map[string]int{}
		rows, err := tx.Query(ctx, `SELECT e.aggregate_type, `+backlogColumns+`
FROM `+a.t.events+` e WHERE e.published_at IS NULL
GROUP BY e.aggregate_type ORDER BY e.aggregate_type`)
		if err != nil {
			return fmt.Errorf("read backlog: %w", err)
		}
		for rows.Next() {
			var ts AggregateTypeStatus
			if err := rows.Scan(append([]any{&ts.AggregateType}, ts.Backlog.scanArgs()...)...); err != nil {
				rows.Close()
				return fmt.Errorf("read backlog: %w", err)
			}
			byType[ts.AggregateType] = len(st.AggregateTypes)
			st.AggregateTypes = append(st.AggregateTypes, ts)
			st.Pending += ts.Pending
			st.Retrying += ts.Retrying
			st.Leased += ts.Leased
			st.ExpiredLeases += ts.ExpiredLeases
			st.Quarantined += ts.Quarantined
			st.OldestPendingAgeSeconds = max(st.OldestPendingAgeSeconds, ts.OldestPendingAgeSeconds)
			st.OldestUnparkedAgeSeconds = max(st.OldestUnparkedAgeSeconds, ts.OldestUnparkedAgeSeconds)
			st.OldestParkedAgeSeconds = max(st.OldestParkedAgeSeconds, ts.OldestParkedAgeSeconds)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read backlog: %w", err)
		}
		rows, err = tx.Query(ctx, `SELECT aggregate_type, count(*) FROM `+a.t.events+`
WHERE published_at > now() - interval '1 minute' AND skipped_at IS NULL
GROUP BY aggregate_type ORDER BY aggregate_type`)
		if err != nil {
			return fmt.Errorf("read published: %w", err)
		}
		for rows.Next() {
			var typ string
			var n int64
			if err := rows.Scan(&typ, &n); err != nil {
				rows.Close()
				return fmt.Errorf("read published: %w", err)
			}
			st.PublishedLastMinute += n
			i, ok := byType[typ]
			if !ok {
				i = len(st.AggregateTypes)
				st.AggregateTypes = append(st.AggregateTypes, AggregateTypeStatus{AggregateType: typ})
			}
			st.AggregateTypes[i].PublishedLastMinute = n
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read published: %w", err)
		}
		if err := tx.QueryRow(ctx, blockedByQuarantineSQL(a.t.events)).Scan(&st.BlockedByQuarantine); err != nil {
			return fmt.Errorf("count blocked events: %w", err)
		}
		if st.Relays, err = a.relays(ctx, tx); err != nil {
			return err
		}
		for _, r := range st.Relays {
			if r.Alive {
				st.RelaysAlive++
			}
		}
		if st.Tables, st.Indexes, err = a.sizes(ctx, tx); err != nil {
			return err
		}
		if st.Partitions, err = a.partitions(ctx, tx, st.At); err != nil {
			return fmt.Errorf("read partitions: %w", err)
		}
		if st.Partitions != nil {
			// The events of a partition whose detach is unfinished are not
			// in outbox_events' backlog read above.
			for _, p := range st.Partitions.Partitions {
				if p.DetachPending || p.Detached {
					st.Pending += p.Unpublished - p.Quarantined
					st.Quarantined += p.Quarantined
				}
			}
		}
		st.RecentOperations, err = a.operations(ctx, tx, 5)
		return err
	})
	if err != nil {
		return Status{}, fmt.Errorf("outbox status of schema %s: %w", a.schema.Name(), err)
	}
	return st, nil
}

func (a *Admin) relays(ctx context.Context, q pgtx.Querier) ([]RelayInfo, error) {
	// ack_durability (migration 010) and health (015) are read through
	// to_jsonb, which works on a schema without the columns too, and only
	// when at most RelayNoteMaxBytes: the relay role writes them.
	// The times are timestamptz, which takes 'infinity' and '-infinity':
	// neither is a time a relay wrote, nor one time.Time holds, so such a
	// time is read as NULL (zero), flagged, and its row is not alive.
	rows, err := q.Query(ctx, `SELECT relay_id, hostname, pid,
	CASE WHEN isfinite(started_at) THEN started_at END, CASE WHEN isfinite(heartbeat_at) THEN heartbeat_at END,
	CASE WHEN isfinite(expires_at) THEN expires_at END,
	expires_at > now() AND NOT ahead AND isfinite(heartbeat_at) AND isfinite(expires_at)
		AND heartbeat_at + make_interval(secs => $3) > now(), ahead,
	CASE WHEN isfinite(heartbeat_at) THEN extract(epoch FROM heartbeat_at - now())::float8 END, overlong,
	CASE WHEN coalesce(pg_column_size(d.ack), 0) <= $1 THEN d.ack END, coalesce(pg_column_size(d.ack), 0),
	CASE WHEN coalesce(pg_column_size(d.health), 0) <= $1 THEN d.health END, coalesce(pg_column_size(d.health), 0)
FROM `+a.t.relays+` r
CROSS JOIN LATERAL (SELECT to_jsonb(r) -> 'ack_durability' AS ack, to_jsonb(r) -> 'health' AS health,
	r.heartbeat_at > now() + make_interval(secs => $2) AS ahead,
	isfinite(r.heartbeat_at) AND isfinite(r.expires_at) AND r.expires_at > r.heartbeat_at + make_interval(secs => $3) AS overlong) d
ORDER BY relay_id`, RelayNoteMaxBytes, RelayClockSkew.Seconds(), RelayHeartbeatLifetimeMax.Seconds())
	if err != nil {
		return nil, fmt.Errorf("read relays: %w", err)
	}
	out, err := pgtx.Collect(rows, func(row pgtx.Row) (RelayInfo, error) {
		var r RelayInfo
		var ack, health []byte
		var ahead bool
		var aheadSecs *float64
		var started, beat, expires *time.Time
		var ackSize, healthSize int64
		var overlong bool
		err := row.Scan(&r.ID, &r.Hostname, &r.PID, &started, &beat, &expires, &r.Alive, &ahead, &aheadSecs,
			&overlong, &ack, &ackSize, &health, &healthSize)
		var untrusted []string
		for _, t := range []struct {
			what string
			at   *time.Time
			to   *time.Time
		}{{"started_at", started, &r.StartedAt}, {"heartbeat_at", beat, &r.HeartbeatAt}, {"expires_at", expires, &r.ExpiresAt}} {
			if t.at == nil {
				if err == nil {
					untrusted = append(untrusted, t.what+" is not a finite time: not counted alive")
				}
				continue
			}
			*t.to = t.at.UTC()
		}
		if ahead {
			by := "infinitely"
			if aheadSecs != nil {
				by = (time.Duration(min(*aheadSecs, float64(math.MaxInt64/time.Second))) * time.Second).String()
			}
			untrusted = append(untrusted, fmt.Sprintf("heartbeat_at is %s ahead of the database's clock: not a relay's heartbeat (it takes the database's now()); not counted alive", by))
		}
		if overlong {
			untrusted = append(untrusted, fmt.Sprintf("expires_at is more than %s after heartbeat_at, longer than any relay's heartbeat lives: counted alive for %s after heartbeat_at at most",
				RelayHeartbeatLifetimeMax, RelayHeartbeatLifetimeMax))
		}
		for _, n := range []struct {
			what string
			size int64
		}{{"ack_durability", ackSize}, {"health", healthSize}} {
			if n.size > RelayNoteMaxBytes {
				untrusted = append(untrusted, fmt.Sprintf("%s document of %d bytes, over the %d read: not read", n.what, n.size, RelayNoteMaxBytes))
			}
		}
		r.Untrusted = strings.Join(untrusted, "; ")
		// Both documents are a relay's notes, written by the relay role and
		// by relays of other versions: one that this version cannot read is
		// left unknown (nil), as History skips unreadable minutes, rather
		// than failing the whole status over one row's monitoring note.
		if err == nil && len(ack) > 0 && string(ack) != "null" {
			var d AckDurability
			if json.Unmarshal(ack, &d) == nil {
				r.AckDurability = &d
			}
		}
		if err == nil && len(health) > 0 && string(health) != "null" {
			var h RelayHealth
			if json.Unmarshal(health, &h) == nil {
				r.Health = &h
			}
		}
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("read relays: %w", err)
	}
	return out, nil
}

func (a *Admin) sizes(ctx context.Context, q pgtx.Querier) ([]TableSize, []IndexSize, error) {
	// A partitioned table (outbox_events, outboxmigrate.Partition) and its
	// indexes have no storage of their own: theirs is the sum of their
	// partitions'. pg_partition_tree of a plain table or index returns no
	// row (PostgreSQL 15): its leaf is itself.
	rows, err := q.Query(ctx, `SELECT c.relname, z.rows, z.heap, z.idx, z.total
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL (SELECT coalesce(CASE WHEN bool_and(l.reltuples < 0) THEN -1 ELSE sum(greatest(l.reltuples, 0)) END, -1)::bigint AS rows,
	coalesce(sum(pg_relation_size(l.oid)), 0)::bigint AS heap, coalesce(sum(pg_indexes_size(l.oid)), 0)::bigint AS idx,
	coalesce(sum(pg_total_relation_size(l.oid)), 0)::bigint AS total
	FROM (SELECT t.relid FROM pg_partition_tree(c.oid) t WHERE t.isleaf AND c.relkind = 'p'
		UNION ALL SELECT c.oid WHERE c.relkind <> 'p') t JOIN pg_class l ON l.oid = t.relid) z
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname = ANY(string_to_array($2, ','))
ORDER BY c.relname`, a.schema.Name(), ownTablesList)
	if err != nil {
		return nil, nil, fmt.Errorf("read table sizes: %w", err)
	}
	tables, err := pgtx.Collect(rows, func(row pgtx.Row) (TableSize, error) {
		var t TableSize
		return t, row.Scan(&t.Table, &t.Rows, &t.HeapBytes, &t.IndexBytes, &t.TotalBytes)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read table sizes: %w", err)
	}
	rows, err = q.Query(ctx, `SELECT i.relname, t.relname,
	(SELECT coalesce(sum(pg_relation_size(p.relid)), 0)::bigint FROM (
		SELECT p.relid FROM pg_partition_tree(i.oid) p WHERE p.isleaf AND i.relkind = 'I'
		UNION ALL SELECT i.oid WHERE i.relkind <> 'I') p)
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = $1 AND t.relname = ANY(string_to_array($2, ','))
ORDER BY t.relname, i.relname`, a.schema.Name(), ownTablesList)
	if err != nil {
		return nil, nil, fmt.Errorf("read index sizes: %w", err)
	}
	indexes, err := pgtx.Collect(rows, func(row pgtx.Row) (IndexSize, error) {
		var i IndexSize
		return i, row.Scan(&i.Index, &i.Table, &i.Bytes)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read index sizes: %w", err)
	}
	return tables, indexes, nil
}

func (a *Admin) operations(ctx context.Context, q pgtx.Querier, limit int) ([]Operation, error) {
	rows, err := q.Query(ctx, `SELECT operation_id, at, action, actor, event_id, coalesce(reason, ''), detail
FROM `+a.t.operations+` ORDER BY operation_id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("read operations: %w", err)
	}
	out, err := pgtx.Collect(rows, scanOperation)
	if err != nil {
		return nil, fmt.Errorf("read operations: %w", err)
	}
	return out, nil
}

// Gauges are the database-side figures a metrics exporter samples: the
// cheap subset of Status.
type Gauges struct {
	Backlog
	// RelaysAlive counts relays whose heartbeat has not expired.
	RelaysAlive int
	// TableBytes is the total size (indexes and TOAST included) of each of
	// the outbox's tables, by table name.
	TableBytes map[string]int64
}

// Gauges samples the backlog (one pass over the unsettled rows), the relays
// alive and the table sizes: three small queries in one read-only
// transaction.
func (a *Admin) Gauges(ctx context.Context) (Gauges, error) {
	g := Gauges{TableBytes: map[string]int64{}}
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{ReadOnly: true}, func(tx pgtx.Querier) error {
		if err := tx.QueryRow(ctx, `SELECT `+backlogColumns+`, (SELECT count(*) FROM `+a.t.relays+`
	WHERE expires_at > now() AND heartbeat_at <= now() + make_interval(secs => $1) AND isfinite(heartbeat_at) AND isfinite(expires_at)
	  AND heartbeat_at + make_interval(secs => $2) > now())
FROM `+a.t.events+` e WHERE e.published_at IS NULL`, RelayClockSkew.Seconds(), RelayHeartbeatLifetimeMax.Seconds()).Scan(append(g.Backlog.scanArgs(), &g.RelaysAlive)...); err != nil {
			return fmt.Errorf("read backlog: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT c.relname, pg_total_relation_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname = ANY(string_to_array($2, ','))`, a.schema.Name(), ownTablesList)
		if err != nil {
			return fmt.Errorf("read table sizes: %w", err)
		}
		_, err = pgtx.Collect(rows, func(row pgtx.Row) (struct{}, error) {
			var name string
			var size int64
			err := row.Scan(&name, &size)
			g.TableBytes[name] = size
			return struct{}{}, err
		})
		if err != nil {
			return fmt.Errorf("read table sizes: %w", err)
		}
		return nil
	})
	if err != nil {
		return Gauges{}, fmt.Errorf("outbox gauges of schema %s: %w", a.schema.Name(), err)
	}
	return g, nil
}

// EventInfo describes one event for an operator.
type EventInfo struct {
	// ID, AggregateType, AggregateID, Sequence, Type, SchemaVersion and
	// OccurredAt are the event's.
	ID            uuid.UUID `json:"event_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Sequence      int64     `json:"aggregate_sequence"`
	Type          string    `json:"event_type"`
	SchemaVersion int       `json:"schema_version"`
	OccurredAt    time.Time `json:"occurred_at"`
	// Attempts is the number of failed publish attempts that counted
	// (attempt_count).
	Attempts int `json:"attempt_count"`
	// LastError is the last failed attempt's error.
	LastError string `json:"last_error,omitempty"`
	// QuarantinedAt is set while the event is quarantined (and stays set on
	// a skipped event: it was quarantined when it was skipped).
	QuarantinedAt *time.Time `json:"quarantined_at,omitempty"`
	// PublishedAt is when the event was settled: published, or skipped.
	PublishedAt *time.Time `json:"published_at,omitempty"`
	// SkippedAt, SkippedBy and SkipReason record a skip: when, who, why.
	SkippedAt  *time.Time `json:"skipped_at,omitempty"`
	SkippedBy  string     `json:"skipped_by,omitempty"`
	SkipReason string     `json:"skip_reason,omitempty"`
	// Blocked counts the later unpublished events of the aggregate, which
	// wait behind this one (set by ListQuarantined).
	Blocked int64 `json:"blocked"`
	// PayloadPreview is the start of the payload, when ListQuarantined was
	// asked for it (QuarantineFilter.PreviewBytes); invalid UTF-8 (a cut
	// character, a binary payload) is replaced.
	PayloadPreview string `json:"payload_preview,omitempty"`
}

// QuarantineCursor returns the event's position in ListQuarantined's
// order, for the next page (QuarantineFilter.After). The event must be
// quarantined.
func (e EventInfo) QuarantineCursor() QuarantineCursor {
	c := QuarantineCursor{ID: e.ID}
	if e.QuarantinedAt != nil {
		c.QuarantinedAt = *e.QuarantinedAt
	}
	return c
}

// State is "pending", "quarantined", "published" or "skipped".
func (e EventInfo) State() string {
	switch {
	case e.SkippedAt != nil:
		return "skipped"
	case e.PublishedAt != nil:
		return "published"
	case e.QuarantinedAt != nil:
		return "quarantined"
	}
	return "pending"
}

const eventInfoColumns = `e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type, e.schema_version,
	e.occurred_at, e.attempt_count, coalesce(e.last_error, ''), e.quarantined_at, e.published_at, e.skipped_at,
	coalesce(e.skipped_by, ''), coalesce(e.skip_reason, '')`

func scanEventInfo(row pgtx.Row, extra ...any) (EventInfo, error) {
	var e EventInfo
	err := row.Scan(append([]any{&e.ID, &e.AggregateType, &e.AggregateID, &e.Sequence, &e.Type, &e.SchemaVersion,
		&e.OccurredAt, &e.Attempts, &e.LastError, &e.QuarantinedAt, &e.PublishedAt, &e.SkippedAt,
		&e.SkippedBy, &e.SkipReason}, extra...)...)
	e.OccurredAt = e.OccurredAt.UTC()
	for _, t := range []*time.Time{e.QuarantinedAt, e.PublishedAt, e.SkippedAt} {
		if t != nil {
			*t = t.UTC()
		}
	}
	return e, err
}

// QuarantineFilter narrows ListQuarantined.
type QuarantineFilter struct {
	// AggregateType, when set, lists only that aggregate type's events.
	AggregateType string
	// Limit is the most events listed. Defaults to 100.
	Limit int
	// After, when set, lists only the events after it in the list's order
	// (keyset pagination): pass the QuarantineCursor of the last event of
	// the previous page.
	After *QuarantineCursor
	// PreviewBytes, when positive, fills EventInfo.PayloadPreview with at
	// most that many bytes of each event's payload. Defaults to none.
	PreviewBytes int
	// EventType, when set, lists only events of that type.
	EventType string
	// ErrorContains, when set, lists only events whose last error contains
	// it, ignoring case.
	ErrorContains string
	// Through, when set, lists only the events at or before it in the
	// list's order: what an operator saw in a preview, and nothing
	// quarantined since (a bulk action applies to no more).
	Through *QuarantineCursor
}

// where returns the conditions of f after the quarantine's own, as SQL on
// alias e, with their arguments numbered from len(args)+1. A condition is
// there only when set, so that the plan seeks (a cached generic plan of
// "$n IS NULL OR ..." would filter instead).
func (f QuarantineFilter) where(args []any) (string, []any) {
	var b strings.Builder
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if f.AggregateType != "" {
		b.WriteString("\n  AND e.aggregate_type = " + arg(f.AggregateType))
	}
	if f.EventType != "" {
		b.WriteString("\n  AND e.event_type = " + arg(f.EventType))
	}
	if f.ErrorContains != "" {
		b.WriteString("\n  AND strpos(lower(coalesce(e.last_error, '')), lower(" + arg(f.ErrorContains) + ")) > 0")
	}
	if f.After != nil {
		at, id := arg(f.After.QuarantinedAt), arg(f.After.ID)
		b.WriteString("\n  AND (e.quarantined_at, e.event_id) > (" + at + ", " + id + ")")
	}
	if f.Through != nil {
		// The bare bound lets the planner stop the index scan there.
		at, id := arg(f.Through.QuarantinedAt), arg(f.Through.ID)
		b.WriteString("\n  AND e.quarantined_at <= " + at + " AND (e.quarantined_at, e.event_id) <= (" + at + ", " + id + ")")
	}
	return b.String(), args
}

// QuarantineCursor is a position in ListQuarantined's order (quarantine
// time, then event id).
type QuarantineCursor struct {
	QuarantinedAt time.Time
	ID            uuid.UUID
}

// ListQuarantined returns the quarantined events, oldest quarantine first,
// each with its last error and the number of events blocked behind it. Each
// page reads the quarantine index from its cursor, never the whole backlog.
func (a *Admin) ListQuarantined(ctx context.Context, f QuarantineFilter) ([]EventInfo, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("outbox: list quarantined: limit %d is negative", f.Limit)
	}
	if f.PreviewBytes < 0 {
		return nil, fmt.Errorf("outbox: list quarantined: preview bytes %d is negative", f.PreviewBytes)
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	where, args := f.where([]any{f.Limit, f.PreviewBytes})
	// The preview is cut in SQL, so a large payload is not read whole;
	// a jsonb payload is cut as its text, a bytea one as its bytes.
	rows, err := a.db.Query(ctx, quarantineListSQL(a.t.events, where), args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list quarantined: %w", err)
	}
	out, err := pgtx.Collect(rows, func(row pgtx.Row) (EventInfo, error) {
		var blocked int64
		var preview []byte
		e, err := scanEventInfo(row, &blocked, &preview)
		e.Blocked = blocked
		if len(preview) > 0 {
			e.PayloadPreview = strings.ToValidUTF8(string(preview), "\uFFFD")
		}
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list quarantined: %w", err)
	}
	return out, nil
}

// CountQuarantined counts the quarantined events f selects (f.Limit and
// f.PreviewBytes aside), up to upTo: it reads at most upTo entries of the
// quarantine index, and a result of upTo means "upTo or more".
func (a *Admin) CountQuarantined(ctx context.Context, f QuarantineFilter, upTo int64) (int64, error) {
	if upTo <= 0 {
		return 0, fmt.Errorf("outbox: count quarantined: bound %d is not positive", upTo)
	}
	where, args := f.where([]any{upTo})
	var n int64
	err := a.db.QueryRow(ctx, quarantineCountSQL(a.t.events, where), args...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox: count quarantined: %w", err)
	}
	return n, nil
}

// Event returns one event's state.
func (a *Admin) Event(ctx context.Context, id uuid.UUID) (EventInfo, error) {
	e, err := scanEventInfo(a.db.QueryRow(ctx, `SELECT `+eventInfoColumns+` FROM `+a.t.events+` e WHERE e.event_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return EventInfo{}, fmt.Errorf("outbox: event %s: %w", id, ErrEventNotFound)
	}
	if err != nil {
		return EventInfo{}, fmt.Errorf("outbox: event %s: %w", id, err)
	}
	return e, nil
}

// lockQuarantined locks the event's row in tx and checks it is quarantined
// (and, with seen, quarantined since then).
func (a *Admin) lockQuarantined(ctx context.Context, tx pgtx.Querier, id uuid.UUID, seen *time.Time) (EventInfo, error) {
	e, err := scanEventInfo(tx.QueryRow(ctx, `SELECT `+eventInfoColumns+` FROM `+a.t.events+` e WHERE e.event_id = $1 FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return e, fmt.Errorf("event %s: %w", id, ErrEventNotFound)
	}
	if err != nil {
		return e, fmt.Errorf("event %s: %w", id, err)
	}
	if st := e.State(); st != "quarantined" {
		return e, fmt.Errorf("event %s: %w (it is %s)", id, ErrNotQuarantined, st)
	}
	if seen != nil && !e.QuarantinedAt.Equal(*seen) {
		return e, fmt.Errorf("event %s: %w (at %s; seen quarantined at %s)", id, ErrQuarantineChanged,
			e.QuarantinedAt.Format(time.RFC3339Nano), seen.UTC().Format(time.RFC3339Nano))
	}
	return e, nil
}

// laneNeighbour is the first unsettled event of e's aggregate before e
// (before) or after e (after), if any: its id, sequence and whether it is
// quarantined.
type laneNeighbour struct {
	ID          uuid.UUID
	Sequence    int64
	Quarantined bool
}

func (n laneNeighbour) String() string {
	state := "pending"
	if n.Quarantined {
		state = "quarantined"
	}
	return fmt.Sprintf("#%d (event %s) is %s", n.Sequence, n.ID, state)
}

// neighbour reads the first unsettled event of e's aggregate before e
// (before true: the lowest such sequence, the lane's head) or after it (the
// next one). An event never goes from settled back to unsettled and writers
// only append, so "none before" stays true once read.
func (a *Admin) neighbour(ctx context.Context, tx pgtx.Querier, e EventInfo, before bool) (*laneNeighbour, error) {
	cond, order := "p.aggregate_sequence < $3", "p.aggregate_sequence"
	if !before {
		cond = "p.aggregate_sequence > $3"
	}
	var n laneNeighbour
	err := tx.QueryRow(ctx, `SELECT p.event_id, p.aggregate_sequence, p.quarantined_at IS NOT NULL FROM `+a.t.events+` p
WHERE p.published_at IS NULL AND p.aggregate_type = $1 AND p.aggregate_id = $2 AND `+cond+`
ORDER BY `+order+` LIMIT 1`, e.AggregateType, e.AggregateID, e.Sequence).Scan(&n.ID, &n.Sequence, &n.Quarantined)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the lane of event %s: %w", e.ID, err)
	}
	return &n, nil
}

// Retry puts a quarantined event back in its lane: it is pending again,
// with its attempts reset (its last error is kept), and the relays are
// woken. It may be anywhere in its lane. When it is the lane's head, or
// waits behind a pending event, it is due at once and the events waiting
// behind it are unparked (due again) in the same transaction. When it waits
// behind an earlier quarantined event, it stays parked behind that one,
// like the lane's other events, and goes out once that one is retried and
// published, or skipped. by names who retries, for the audit log. It
// returns the event as it was before the retry.
func (a *Admin) Retry(ctx context.Context, id uuid.UUID, by string) (EventInfo, error) {
	return a.retry(ctx, id, nil, by)
}

// RetrySeen is Retry of the quarantine an operator saw (the event id and
// quarantine time of seen, as ListQuarantined returned them): it is refused
// with ErrQuarantineChanged when the event was retried and quarantined
// again since, and with ErrNotQuarantined when it is no longer
// quarantined. A bulk action retries what its preview showed, no more.
func (a *Admin) RetrySeen(ctx context.Context, seen QuarantineCursor, by string) (EventInfo, error) {
	return a.retry(ctx, seen.ID, &seen.QuarantinedAt, by)
}

func (a *Admin) retry(ctx context.Context, id uuid.UUID, seen *time.Time, by string) (EventInfo, error) {
	if by == "" {
		return EventInfo{}, fmt.Errorf("outbox: retry event %s: %w", id, ErrActorRequired)
	}
	var e EventInfo
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		var err error
		if e, err = a.lockQuarantined(ctx, tx, id, seen); err != nil {
			return err
		}
		head, err := a.neighbour(ctx, tx, e, true)
		if err != nil {
			return err
		}
		blocked := head != nil && head.Quarantined
		availableAt := dueAgainSQL()
		if blocked {
			availableAt = parkedAvailableAt
		}
		if _, err := tx.Exec(ctx, `UPDATE `+a.t.events+`
SET quarantined_at = NULL, attempt_count = 0, available_at = `+availableAt+`,
	claimed_by = NULL, claim_token = NULL, claim_until = NULL
WHERE event_id = $1`, id); err != nil {
			return err
		}
		if !blocked {
			if err := unparkTx(ctx, tx, a.schema, e.AggregateType, e.AggregateID); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+a.t.operations+` (action, actor, event_id, detail)
VALUES ('retry', $1, $2, jsonb_build_object('attempt_count', $3::int, 'last_error', $4::text))`, by, id, e.Attempts, e.LastError)
		return err
	})
	if err != nil {
		return EventInfo{}, fmt.Errorf("outbox: retry: %w", err)
	}
	a.wake(ctx)
	return e, nil
}

// Skip settles a quarantined event without publishing it, to unblock its
// aggregate: it will never be published (nor replayed), and the
// aggregate's next event goes out carrying Message.SkippedFrom, so that
// inboxes accept it although this one never arrives. by and reason are
// required; who, when and why are recorded on the event (skipped_by,
// skipped_at, skip_reason) and in the audit log. The events waiting behind
// it are unparked (due again) in the same transaction, unless the next one
// is quarantined too (they then stay parked behind it). It returns the
// event as skipped.
//
// Only the aggregate's first unsettled event can be skipped: a quarantined
// event behind an earlier unsettled one (pending, or quarantined itself) is
// refused with ErrNotLaneHead, naming that earlier event. Settling it would
// make the events after it heads of the lane while the earlier one is not
// published, and the relay would publish them first. Skip the earlier one
// first, or retry it and let the relay publish it.
func (a *Admin) Skip(ctx context.Context, id uuid.UUID, by, reason string) (EventInfo, error) {
	return a.skip(ctx, id, nil, by, reason)
}

// SkipSeen is Skip of the quarantine an operator saw, as RetrySeen is
// Retry's: refused with ErrQuarantineChanged when the event was retried and
// quarantined again since seen. The rule of Skip holds: only the first
// unsettled event of its aggregate can be skipped (ErrNotLaneHead).
func (a *Admin) SkipSeen(ctx context.Context, seen QuarantineCursor, by, reason string) (EventInfo, error) {
	return a.skip(ctx, seen.ID, &seen.QuarantinedAt, by, reason)
}

func (a *Admin) skip(ctx context.Context, id uuid.UUID, seen *time.Time, by, reason string) (EventInfo, error) {
	switch {
	case reason == "":
		return EventInfo{}, fmt.Errorf("outbox: skip event %s: %w", id, ErrReasonRequired)
	case by == "":
		return EventInfo{}, fmt.Errorf("outbox: skip event %s: %w", id, ErrActorRequired)
	}
	var e EventInfo
	err := a.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		locked, err := a.lockQuarantined(ctx, tx, id, seen)
		if err != nil {
			return err
		}
		head, err := a.neighbour(ctx, tx, locked, true)
		if err != nil {
			return err
		}
		if head != nil {
			return fmt.Errorf("event %s (%s/%s #%d): %w: %s; skip or retry that one first, or wait until it is published",
				id, locked.AggregateType, locked.AggregateID, locked.Sequence, ErrNotLaneHead, head)
		}
		// skipped_from continues a run of skipped events just before this
		// one (the previous event is settled: this one is the head).
		e, err = scanEventInfo(tx.QueryRow(ctx, `UPDATE `+a.t.events+` e
SET published_at = now(), skipped_at = now(), skipped_by = $2, skip_reason = $3,
	skipped_from = coalesce((SELECT p.skipped_from FROM `+a.t.events+` p
		WHERE p.aggregate_type = e.aggregate_type AND p.aggregate_id = e.aggregate_id
		  AND p.aggregate_sequence = e.aggregate_sequence - 1 AND p.skipped_at IS NOT NULL), e.aggregate_sequence),
	claimed_by = NULL, claim_token = NULL, claim_until = NULL
WHERE e.event_id = $1
RETURNING `+eventInfoColumns, id, by, reason))
		if err != nil {
			return err
		}
		// The next event becomes the head: unpark the lane, unless that
		// one is quarantined too and the lane stays blocked behind it.
		next, err := a.neighbour(ctx, tx, e, false)
		if err != nil {
			return err
		}
		if next == nil || !next.Quarantined {
			if err := unparkTx(ctx, tx, a.schema, e.AggregateType, e.AggregateID); err != nil {
				return err
			}
			// A next event as written may have been read by every relay's
			// incremental claim while it was not the head, and passed;
			// nothing else would look for it before the full scan. Made due
			// now, it is scheduled, where the incremental claim looks.
			if _, err := tx.Exec(ctx, `UPDATE `+a.t.events+` SET available_at = `+dueAgainSQL()+`
WHERE aggregate_type = $1 AND aggregate_id = $2 AND aggregate_sequence = $3 + 1
  AND published_at IS NULL AND quarantined_at IS NULL AND available_at = occurred_at`,
				e.AggregateType, e.AggregateID, e.Sequence); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+a.t.operations+` (action, actor, event_id, reason, detail)
VALUES ('skip', $1, $2, $3, jsonb_build_object('aggregate_type', $4::text, 'aggregate_id', $5::text,
	'aggregate_sequence', $6::bigint, 'attempt_count', $7::int, 'last_error', $8::text))`,
			by, id, reason, e.AggregateType, e.AggregateID, e.Sequence, e.Attempts, e.LastError)
		return err
	})
	if err != nil {
		return EventInfo{}, fmt.Errorf("outbox: skip: %w", err)
	}
	a.wake(ctx)
	return e, nil
}

// wake notifies the schema's relays, so that a retried or unblocked lane
// moves now rather than at the next poll. A failure only delays that.
func (a *Admin) wake(ctx context.Context) {
	_, _ = a.db.Exec(ctx, "SELECT pg_notify($1, '')", NotifyChannel(a.schema.Name()))
}

// Cleanup deletes settled events past cfg.OlderThan and, with
// cfg.InboxOlderThan, inbox rows past that, in bounded batches (see
// CleanupConfig). It never deletes an unpublished or quarantined event, and
// a crash or cancellation loses at most the uncommitted batch; run it again
// to go on.
func (a *Admin) Cleanup(ctx context.Context, cfg CleanupConfig) (CleanupResult, error) {
	if err := cfg.validate(); err != nil {
		return CleanupResult{}, err
	}
	c := newCleaner(a.db, a.schema, a.obs)
	c.upkeep = func(ctx context.Context, horizon time.Duration) (partman.Result, error) {
		switch db := a.db.(type) {
		case pgtx.PgxPool:
			return upkeepPartitions(ctx, db.Pool, a.schema, horizon, PartitionsAheadDefault)
		case pgtx.SQLDB:
			conn, err := db.DB.Conn(ctx)
			if err != nil {
				return partman.Result{}, err
			}
			defer conn.Close()
			return upkeepSession(ctx, pgtx.SQLConnOf(conn), func() { _ = conn.Raw(func(any) error { return driver.ErrBadConn }) }, a.schema, horizon, PartitionsAheadDefault)
		}
		return partman.Result{}, fmt.Errorf("partition upkeep on %T: not a pool or a database", a.db)
	}
	res, err := c.run(ctx, cfg)
	if err != nil {
		return res, fmt.Errorf("outbox: clean-up of schema %s: %w", a.schema.Name(), err)
	}
	return res, nil
}

// The statements that look for quarantined events state it as
// quarantinedOpen, so that they read outbox_quarantine_key_idx (migration
// 017), never an index of pending events.

// blockedByQuarantineSQL counts the unpublished events behind a quarantined
// one in its lane.
func blockedByQuarantineSQL(events string) string {
	return `SELECT coalesce(sum(b.n), 0) FROM ` + events + ` q
CROSS JOIN LATERAL (SELECT count(*) AS n FROM ` + events + ` p
	WHERE p.published_at IS NULL AND p.aggregate_type = q.aggregate_type
	  AND p.aggregate_id = q.aggregate_id AND p.aggregate_sequence > q.aggregate_sequence) b
WHERE ` + quarantinedOpen("q")
}

// quarantineListSQL lists quarantined events, oldest quarantine first, with
// the count of events blocked behind each and a preview of its payload: $1
// the limit, $2 the preview's bytes, where the filter's clauses.
func quarantineListSQL(events, where string) string {
	return `SELECT ` + eventInfoColumns + `,
	(SELECT count(*) FROM ` + events + ` p WHERE p.published_at IS NULL AND p.aggregate_type = e.aggregate_type
	   AND p.aggregate_id = e.aggregate_id AND p.aggregate_sequence > e.aggregate_sequence),
	CASE WHEN $2 = 0 THEN NULL
	     WHEN e.payload IS NOT NULL THEN convert_to(left(e.payload::text, $2), 'UTF8')
	     ELSE substring(e.payload_bytes FROM 1 FOR $2) END
FROM ` + events + ` e
WHERE ` + quarantinedOpen("e") + where + `
ORDER BY e.quarantined_at, e.event_id
LIMIT $1`
}

// quarantineCountSQL counts the quarantined events where selects, up to $1.
func quarantineCountSQL(events, where string) string {
	return `SELECT count(*) FROM (SELECT 1 FROM ` + events + ` e
WHERE ` + quarantinedOpen("e") + where + `
LIMIT $1) s`
}
