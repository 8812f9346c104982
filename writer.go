package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// MaxPayloadBytesDefault is the default limit on an event's payload size.
const MaxPayloadBytesDefault = 1 << 20

// WriterConfig configures a Writer.
type WriterConfig struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Defaults to
	// "outbox".
	Schema string
	// MaxPayloadBytes is the largest payload accepted. Defaults to
	// MaxPayloadBytesDefault (1 MiB).
	MaxPayloadBytes int
	// DisableTraceContext stops the writer from copying the W3C trace
	// context of the caller's context.Context into the events' headers.
	// By default, when ctx carries a valid OpenTelemetry span context, each
	// event gets its "traceparent" (and "tracestate", when there is one)
	// header, unless the event sets that header itself, so the relay's
	// publish and the consumer continue the caller's trace. The writer never
	// starts a span and needs no tracer provider. Defaults to false.
	DisableTraceContext bool
}

// Writer records events in the caller's transaction. It is safe for
// concurrent use and holds no connection of its own.
type Writer struct {
	schema     pgident.Schema
	maxPayload int
	insertSQL  string // any number of events, one jsonb parameter
	insertOne  string // exactly one event, typed parameters
	channel    string
	noTrace    bool
}

// NewWriter validates cfg and returns a Writer.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	s, err := pgident.NewSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if cfg.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("outbox: MaxPayloadBytes %d is negative", cfg.MaxPayloadBytes)
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = MaxPayloadBytesDefault
	}
	return &Writer{
		schema:     s,
		maxPayload: cfg.MaxPayloadBytes,
		insertSQL:  insertEventsSQL(s),
		insertOne:  insertOneSQL(s),
		channel:    NotifyChannel(s.Name()),
		noTrace:    cfg.DisableTraceContext,
	}, nil
}

// bornAvailableAtSQL is the available_at of an event inserted with the
// counter row seq returned: parked when its lane is parked, else now (the
// column's default).
func bornAvailableAtSQL(seq string) string {
	return `CASE WHEN ` + seq + `.parked_at IS NULL THEN now() ELSE ` + parkedAvailableAt + ` END`
}

// parkedThroughSQL is the counter row's new parked_through when n events
// are appended: a parked lane whose events are all parked (parked_through =
// last_sequence) stays so, since these are written parked; otherwise it is
// left for the lane sweep (NULL, not parked, stays NULL).
func parkedThroughSQL(n string) string {
	return `CASE WHEN a.parked_through = a.last_sequence THEN a.last_sequence + ` + n + ` ELSE a.parked_through END`
}

// insertEventsSQL allocates the sequences and inserts the rows of any number
// of events in one statement (one round trip). The per-aggregate counter rows
// are upserted in a fixed order, so writers touching several aggregates
// cannot deadlock each other; the row lock they take serialises writers of
// the same aggregate until commit, so sequences are gap-free and commit in
// order. The upsert also returns the lane's parked flag, read under that
// lock: an event written behind a quarantined event is written parked (see
// parked.go).
func insertEventsSQL(s pgident.Schema) string {
	return `WITH input AS (
	SELECT * FROM jsonb_to_recordset($1::jsonb) AS i(
		ord int, event_id uuid, aggregate_type text, aggregate_id text,
		event_type text, schema_version int, content_type text, payload text, headers jsonb)
), counts AS (
	SELECT aggregate_type, aggregate_id, count(*) AS n
	FROM input GROUP BY aggregate_type, aggregate_id
), seq AS (
	INSERT INTO ` + s.Table("outbox_aggregates") + ` AS a (aggregate_type, aggregate_id, last_sequence)
	SELECT aggregate_type, aggregate_id, n FROM counts ORDER BY aggregate_type, aggregate_id
	ON CONFLICT (aggregate_type, aggregate_id)
	DO UPDATE SET last_sequence = a.last_sequence + EXCLUDED.last_sequence,
		parked_through = ` + parkedThroughSQL("EXCLUDED.last_sequence") + `
	RETURNING a.aggregate_type, a.aggregate_id, a.last_sequence, a.parked_at
)
INSERT INTO ` + s.Table("outbox_events") + ` (event_id, aggregate_type, aggregate_id,
	aggregate_sequence, event_type, schema_version, content_type, payload_bytes, headers, available_at)
SELECT i.event_id, i.aggregate_type, i.aggregate_id,
	s.last_sequence - c.n + row_number() OVER (PARTITION BY i.aggregate_type, i.aggregate_id ORDER BY i.ord),
	i.event_type, i.schema_version, i.content_type, decode(coalesce(i.payload, ''), 'base64'), coalesce(i.headers, '{}'::jsonb),
	` + bornAvailableAtSQL("s") + `
FROM input i
JOIN counts c USING (aggregate_type, aggregate_id)
JOIN seq s USING (aggregate_type, aggregate_id)
ORDER BY i.ord
RETURNING event_id, aggregate_sequence, occurred_at`
}

// insertOneSQL is insertEventsSQL for the common case of a single event:
// the same counter upsert and insert, with typed parameters instead of a
// jsonb document to decode, group and number. It is what one would write by
// hand for one event, and costs the database less than the general
// statement.
func insertOneSQL(s pgident.Schema) string {
	return `WITH seq AS (
	INSERT INTO ` + s.Table("outbox_aggregates") + ` AS a (aggregate_type, aggregate_id, last_sequence)
	VALUES ($2, $3, 1)
	ON CONFLICT (aggregate_type, aggregate_id)
	DO UPDATE SET last_sequence = a.last_sequence + 1, parked_through = ` + parkedThroughSQL("1") + `
	RETURNING a.last_sequence, a.parked_at
)
INSERT INTO ` + s.Table("outbox_events") + ` (event_id, aggregate_type, aggregate_id,
	aggregate_sequence, event_type, schema_version, payload_bytes, headers, content_type, available_at)
SELECT $1::uuid, $2::text, $3::text, seq.last_sequence, $4::text, $5::int, $6::bytea, $7::text::jsonb, $8::text,
	` + bornAvailableAtSQL("seq") + ` FROM seq
RETURNING event_id, aggregate_sequence, occurred_at`
}

// one holds the parameters of insertOneSQL.
type one struct {
	args [8]any
	id   uuid.UUID
}

// prepareOne validates a single event and returns insertOneSQL's
// parameters. Nothing is sent to the database when the event is invalid.
func (w *Writer) prepareOne(ev *Event, tc traceContext) (one, error) {
	if err := ev.validate(0, w.maxPayload); err != nil {
		return one{}, err
	}
	id := ev.ID
	if id == uuid.Nil {
		var err error
		if id, err = uuid.NewV7(); err != nil {
			return one{}, fmt.Errorf("outbox: new event id: %w", err)
		}
	}
	version := ev.SchemaVersion
	if version == 0 {
		version = 1
	}
	headers := "{}"
	if h := tc.headers(ev.Headers); len(h) > 0 {
		b, err := json.Marshal(h)
		if err != nil {
			return one{}, fmt.Errorf("outbox: encode headers: %w", err)
		}
		headers = string(b)
	}
	payload := ev.Payload
	if payload == nil {
		payload = []byte{} // NULL would break the payload CHECK
	}
	return one{id: id, args: [8]any{id.String(), ev.AggregateType, ev.AggregateID, ev.Type, version, payload, headers, contentType(ev.ContentType)}}, nil
}

// contentType is the content_type column's value: NULL for JSON, the
// default.
func contentType(ct string) any {
	if ct == "" || ct == ContentTypeJSON {
		return nil
	}
	return ct
}

type eventRow struct {
	Ord           int               `json:"ord"`
	EventID       uuid.UUID         `json:"event_id"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	SchemaVersion int               `json:"schema_version"`
	ContentType   string            `json:"content_type,omitempty"`
	Payload       []byte            `json:"payload"` // base64 in the document
	Headers       map[string]string `json:"headers,omitempty"`
}

// prepare validates events and encodes them as the statement's argument.
// Nothing is sent to the database when any event is invalid.
func (w *Writer) prepare(events []Event, tc traceContext) (string, []uuid.UUID, error) {
	if len(events) == 0 {
		return "", nil, fmt.Errorf("%w: no events given", ErrInvalidEvent)
	}
	rows := make([]eventRow, len(events))
	ids := make([]uuid.UUID, len(events))
	seen := make(map[uuid.UUID]bool, len(events))
	for i := range events {
		ev := &events[i]
		if err := ev.validate(i, w.maxPayload); err != nil {
			return "", nil, err
		}
		id := ev.ID
		if id == uuid.Nil {
			var err error
			if id, err = uuid.NewV7(); err != nil {
				return "", nil, fmt.Errorf("outbox: new event id: %w", err)
			}
		}
		if seen[id] {
			return "", nil, invalid(i, "event id %s given twice", id)
		}
		seen[id] = true
		ids[i] = id
		version := ev.SchemaVersion
		if version == 0 {
			version = 1
		}
		rows[i] = eventRow{
			Ord: i, EventID: id, AggregateType: ev.AggregateType, AggregateID: ev.AggregateID,
			EventType: ev.Type, SchemaVersion: version, Payload: ev.Payload, Headers: tc.headers(ev.Headers),
		}
		if ct, ok := contentType(ev.ContentType).(string); ok {
			rows[i].ContentType = ct
		}
	}
	arg, err := json.Marshal(rows)
	if err != nil {
		return "", nil, fmt.Errorf("outbox: encode events: %w", err)
	}
	return string(arg), ids, nil
}

type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

func collect(r rows, ids []uuid.UUID) ([]Recorded, error) {
	index := make(map[uuid.UUID]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	out := make([]Recorded, len(ids))
	n := 0
	for r.Next() {
		var rec Recorded
		if err := r.Scan(&rec.ID, &rec.Sequence, &rec.OccurredAt); err != nil {
			return nil, err
		}
		i, ok := index[rec.ID]
		if !ok {
			return nil, fmt.Errorf("database returned unknown event id %s", rec.ID)
		}
		rec.OccurredAt = rec.OccurredAt.UTC()
		out[i] = rec
		n++
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	if n != len(ids) {
		return nil, fmt.Errorf("database stored %d of %d events", n, len(ids))
	}
	return out, nil
}

// InsertTx records events in tx, the caller's pgx transaction, and returns
// what was stored, in the order given. The events become visible to the relay
// when tx commits and vanish if it rolls back. Invalid events are refused
// with an error wrapping ErrInvalidEvent before anything is written (the
// transaction stays usable); on any other error the caller should roll tx
// back.
//
// Record all of a transaction's events in one call. Each aggregate's counter
// row stays locked until tx ends, so that its sequences commit in order; one
// call locks the rows of all its aggregates in a fixed order, but two
// transactions that call InsertTx once per aggregate, for the same
// aggregates in different orders, can deadlock (PostgreSQL then aborts one
// of them with SQLSTATE 40P01). If events must be recorded in several calls,
// make every transaction touch aggregates in the same order.
func (w *Writer) InsertTx(ctx context.Context, tx pgx.Tx, events ...Event) ([]Recorded, error) {
	if len(events) == 1 {
		p, err := w.prepareOne(&events[0], w.traceContext(ctx))
		if err != nil {
			return nil, err
		}
		var rec Recorded
		if err := tx.QueryRow(ctx, w.insertOne, p.args[:]...).Scan(&rec.ID, &rec.Sequence, &rec.OccurredAt); err != nil {
			return nil, fmt.Errorf("outbox: insert events: %w", err)
		}
		rec.OccurredAt = rec.OccurredAt.UTC()
		return []Recorded{rec}, nil
	}
	arg, ids, err := w.prepare(events, w.traceContext(ctx))
	if err != nil {
		return nil, err
	}
	r, err := tx.Query(ctx, w.insertSQL, arg)
	if err != nil {
		return nil, fmt.Errorf("outbox: insert events: %w", err)
	}
	defer r.Close()
	out, err := collect(r, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: insert events: %w", err)
	}
	return out, nil
}

// InsertSQLTx is InsertTx for a database/sql transaction, so that code built
// on sqlx, GORM, bun or ent (with any PostgreSQL driver) records events in
// its own transaction. The same rule applies: one call per transaction.
func (w *Writer) InsertSQLTx(ctx context.Context, tx *sql.Tx, events ...Event) ([]Recorded, error) {
	if len(events) == 1 {
		p, err := w.prepareOne(&events[0], w.traceContext(ctx))
		if err != nil {
			return nil, err
		}
		var rec Recorded
		if err := tx.QueryRowContext(ctx, w.insertOne, p.args[:]...).Scan(&rec.ID, &rec.Sequence, &rec.OccurredAt); err != nil {
			return nil, fmt.Errorf("outbox: insert events: %w", err)
		}
		rec.OccurredAt = rec.OccurredAt.UTC()
		return []Recorded{rec}, nil
	}
	arg, ids, err := w.prepare(events, w.traceContext(ctx))
	if err != nil {
		return nil, err
	}
	r, err := tx.QueryContext(ctx, w.insertSQL, arg)
	if err != nil {
		return nil, fmt.Errorf("outbox: insert events: %w", err)
	}
	defer r.Close()
	out, err := collect(r, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: insert events: %w", err)
	}
	return out, r.Close()
}

// Execer is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Notify wakes the relays of the writer's schema so they publish new events
// without waiting for their next poll. Call it after the transaction that
// recorded events has committed, on any connection outside that transaction:
// a NOTIFY inside the writing transaction takes a database-wide lock at
// commit and caps write throughput. Notify is an optimisation only; relays
// poll anyway, so an error here never loses an event. It costs the caller a
// round trip per call; a Notifier does the same without blocking and
// coalesces concurrent wake-ups.
func (w *Writer) Notify(ctx context.Context, db Execer) error {
	_, err := db.Exec(ctx, "SELECT pg_notify($1, '')", w.channel)
	return err
}
