package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// MaxPayloadBytesDefault is the default limit on an event's payload size.
const MaxPayloadBytesDefault = 1 << 20

// WriterConfig configures a Writer.
type WriterConfig struct {
	// Schema is the PostgreSQL schema holding the outbox tables, as a plain
	// string: the older field, kept working; prefer Tables. Defaults to
	// "outbox".
	Schema string
	// Tables is the schema holding the outbox tables: the one Schema value an
	// application gives every component's config (see outbox.Schema). Setting
	// it and Schema to different names is refused (ErrSchemaConflict).
	// Defaults to Schema, then "outbox".
	Tables Schema
	// MaxPayloadBytes is the largest payload accepted. Defaults to
	// MaxPayloadBytesDefault (1 MiB). The database's write functions have a
	// limit of their own, 1 MiB unless the tables' owner raised it
	// (docs/sql-api.md); a larger payload is refused there, with SQLSTATE
	// 22023, aborting the transaction.
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
	insertSQL  string // any number of events, one jsonb parameter: a transaction's first call
	insertLate string // the same, for a later call: checks the order of the aggregates locked
	insertOne  string // exactly one event, typed parameters: a transaction's first call
	channel    string
	noTrace    bool
}

// NewWriter validates cfg and returns a Writer.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	s, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: writer: %w", err)
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
		insertSQL:  insertEventsSQL(s, false),
		insertLate: insertEventsSQL(s, true),
		insertOne:  insertOneSQL(s),
		channel:    NotifyChannel(s.Name()),
		noTrace:    cfg.DisableTraceContext,
	}, nil
}

// The writer's statements call the SQL write API that migration 011
// installs (enqueue, enqueue_many: docs/sql-api.md), so that a writer role
// needs EXECUTE on those functions and no right on the outbox tables, and
// rows written from Go and from any other language are alike. The functions
// validate again what prepare validated (a caller without this package must
// be checked too), allocate the sequences under the counter-row locks,
// write a parked lane's event parked (see parked.go), and record the
// aggregates the transaction holds in a transaction-local setting.

// wroteSetting is the transaction-local setting (set_config(..., true)) in
// which the write functions record the aggregates whose counter rows the
// transaction holds: a jsonb array of strings, schema, aggregate type and
// aggregate id joined by U+001F (which the writer refuses in names and ids,
// see Event.validate). It reverts with the transaction, and with a
// rolled-back savepoint, like the row locks it describes.
const wroteSetting = "outbox.wrote"

// heldKey is the wroteSetting entry of aggregate (typ, id) in schema s.
func heldKey(s pgident.Schema, typ, id string) string {
	return s.Name() + "\x1f" + typ + "\x1f" + id
}

// firstCallSQL is true when the transaction has not written events yet. In
// a statement's WHERE clause, with no column in it, PostgreSQL evaluates it
// once, before the function it guards runs (a one-time filter): on a later
// call the function is not called and the statement returns no row.
const firstCallSQL = `coalesce(current_setting('` + wroteSetting + `', true), '') = ''`

// heldSQL is the aggregates the transaction holds (the wroteSetting value,
// NULL on a first call).
const heldSQL = `nullif(current_setting('` + wroteSetting + `', true), '')::jsonb`

// laterCallOKSQL is true when a call whose aggregates are $2 (a
// wroteSetting value) locks nothing out of order: every aggregate it names
// is held already, or sorts after every one the transaction holds (by
// schema, aggregate type, aggregate id, in the database's collation). Then
// every transaction takes counter rows in one global order and no two can
// wait for each other. enqueue_many refuses such a call too (SQLSTATE
// 55000), but by raising, which aborts the transaction: the writer checks
// first, in the same statement (a one-time filter again), so that a refused
// call leaves the transaction usable.
//
// What the call costs grows with the aggregates held plus those it names,
// not their product (migration 019 does the same in enqueue_hold): the
// largest aggregate held is found once; one sorting after it is new; one
// sorting before it is looked up in a hash of those held, built once, and
// only when some aggregate does sort before it (OFFSET 0 keeps the two
// filters in that order). Each subquery reads the setting itself (heldSQL)
// rather than a column of an outer query, so that none depends on the row:
// the sort is an InitPlan, NOT IN a hashed subplan
// (TestInsertTxLaterCallsReadHeldOnce). The check used to look each
// aggregate up with jsonb_exists on the setting, parsed again for each
// aggregate: one call of 1,000 new aggregates beside 100,000 held took
// 306 s on a loaded 2-core machine, 0.65 s now.
const laterCallOKSQL = `NOT EXISTS (SELECT 1 FROM (
	SELECT k FROM jsonb_array_elements_text($2::jsonb) k
	WHERE (split_part(k, chr(31), 1), split_part(k, chr(31), 2), split_part(k, chr(31), 3)) < (
		SELECT split_part(h, chr(31), 1), split_part(h, chr(31), 2), split_part(h, chr(31), 3)
		FROM jsonb_array_elements_text(` + heldSQL + `) h ORDER BY 1 DESC, 2 DESC, 3 DESC LIMIT 1)
	OFFSET 0) before
	WHERE k NOT IN (SELECT jsonb_array_elements_text(` + heldSQL + `)))`

// insertEventsSQL records any number of events ($1, the jsonb document of
// enqueue_many) in one statement: for a transaction's first call (later
// false) only when it is one, and for a later call only when it locks
// nothing out of order ($2, see laterCallOKSQL). Otherwise it writes
// nothing and returns no row.
func insertEventsSQL(s pgident.Schema, later bool) string {
	filter := firstCallSQL
	if later {
		filter = laterCallOKSQL
	}
	return `SELECT event_id, sequence, occurred_at FROM ` + s.Quoted() + `.enqueue_many($1::jsonb) WHERE ` + filter
}

// insertOneSQL is insertEventsSQL for the common case of a single event:
// enqueue with typed parameters instead of a jsonb document to decode,
// group and number. It is only for a transaction's first call: on a later
// call it returns no row, and InsertTx runs the general statement, which
// checks the order. So the common case pays for a setting read, not for the
// check (whose plan PostgreSQL would set up on every execution).
func insertOneSQL(s pgident.Schema) string {
	return `SELECT event_id, sequence, occurred_at FROM ` + s.Quoted() + `.enqueue($2::text, $3::text, $4::text, $6::bytea,
	content_type => $8::text, headers => $7::text::jsonb, schema_version => $5::int, id => $1::uuid)
WHERE ` + firstCallSQL
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
	Payload       []byte            `json:"payload_base64"` // base64 in the document
	Headers       map[string]string `json:"headers,omitempty"`
}

// prepare validates events and encodes them as the statement's arguments:
// the events, and the wroteSetting value of their aggregates. Nothing is
// sent to the database when any event is invalid.
func (w *Writer) prepare(events []Event, tc traceContext) (arg string, ids []uuid.UUID, held string, err error) {
	if len(events) == 0 {
		return "", nil, "", fmt.Errorf("%w: no events given", ErrInvalidEvent)
	}
	rows := make([]eventRow, len(events))
	ids = make([]uuid.UUID, len(events))
	seen := make(map[uuid.UUID]bool, len(events))
	var keys []string
	seenKey := map[string]bool{}
	for i := range events {
		ev := &events[i]
		if err := ev.validate(i, w.maxPayload); err != nil {
			return "", nil, "", err
		}
		id := ev.ID
		if id == uuid.Nil {
			if id, err = uuid.NewV7(); err != nil {
				return "", nil, "", fmt.Errorf("outbox: new event id: %w", err)
			}
		}
		if seen[id] {
			return "", nil, "", invalid(i, "event id %s given twice", id)
		}
		seen[id] = true
		ids[i] = id
		if k := heldKey(w.schema, ev.AggregateType, ev.AggregateID); !seenKey[k] {
			seenKey[k] = true
			keys = append(keys, k)
		}
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
	b, err := json.Marshal(rows)
	if err != nil {
		return "", nil, "", fmt.Errorf("outbox: encode events: %w", err)
	}
	h, err := json.Marshal(keys)
	if err != nil {
		return "", nil, "", fmt.Errorf("outbox: encode events: %w", err)
	}
	return string(b), ids, string(h), nil
}

// queryFunc runs one of the writer's statements in the caller's
// transaction and collects the events it stored (see collect).
type queryFunc func(sql string, ids []uuid.UUID, args ...any) ([]Recorded, error)

// insertMany records events with the general statement: the one for a
// transaction's first call, unless later says it is not (the single-event
// statement found events already written), then, when the transaction had
// written events before, the one for later calls, which checks the order.
func (w *Writer) insertMany(events []Event, later bool, tc traceContext, query queryFunc) ([]Recorded, error) {
	arg, ids, held, err := w.prepare(events, tc)
	if err != nil {
		return nil, err
	}
	if !later {
		out, err := query(w.insertSQL, ids, arg)
		if !errors.Is(err, errNoneStored) {
			if err != nil {
				return nil, insertError(err)
			}
			return out, nil
		}
	}
	out, err := query(w.insertLate, ids, arg, held)
	if errors.Is(err, errNoneStored) {
		return nil, insertOrderError(events)
	}
	if err != nil {
		return nil, insertError(err)
	}
	return out, nil
}

// ErrNoPartition is wrapped by the error of InsertTx and InsertSQLTx when an event's id falls in no
// partition of a partitioned outbox_events (outboxmigrate.Partition): the
// id is not a UUIDv7 (an id of the caller's, a UUIDv4 say), or its time is
// before the oldest partition or after the newest the relay's upkeep
// created (a clock far off, or no upkeep running for longer than the
// partitions ahead last), or in a partition the upkeep closed before
// dropping it (an id older than the replay horizon: a long transaction's, a
// clock behind). PostgreSQL refused the row (SQLSTATE 23514, "no
// partition of relation ... found for row", or naming the constraint
// outbox_partition_closed): nothing was written, and the
// transaction is aborted; roll it back. Leave Event.ID empty to have the
// writer make a UUIDv7. docs/operations.md, "Partitioned outbox".
var ErrNoPartition = errors.New("the event id falls in no partition of outbox_events")

// insertError wraps an error of the write statements.
func insertError(err error) error {
	if partman.IsNoPartition(err) {
		return fmt.Errorf("outbox: insert events: %w (ids must be UUIDv7s within the partitions' range; leave Event.ID empty to have one made): %w", ErrNoPartition, err)
	}
	return fmt.Errorf("outbox: insert events: %w", err)
}

// errNoneStored: the statement stored none of the events, which it does only
// when the call would lock an aggregate out of order (ErrInsertOrder).
var errNoneStored = errors.New("database stored none of the events")

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
	if n == 0 {
		return nil, errNoneStored
	}
	if n != len(ids) {
		return nil, fmt.Errorf("database stored %d of %d events", n, len(ids))
	}
	return out, nil
}

// ErrInsertOrder is returned (wrapped) by InsertTx and InsertSQLTx for a
// further call in a transaction that would lock an aggregate sorting before
// one the transaction already wrote to. Nothing was written, nothing was
// locked, and the transaction is still usable. See InsertTx.
var ErrInsertOrder = errors.New("a further InsertTx call in a transaction must not write to an aggregate that sorts before one it already wrote to")

// insertOrderError says which of events' aggregates a refused call would
// have locked out of order.
func insertOrderError(events []Event) error {
	var names []string
	seen := map[[2]string]bool{}
	for _, ev := range events {
		k := [2]string{ev.AggregateType, ev.AggregateID}
		if !seen[k] && len(names) < 5 {
			seen[k] = true
			names = append(names, ev.AggregateType+"/"+ev.AggregateID)
		}
	}
	return fmt.Errorf("outbox: insert events of %s: %w (by aggregate type, then id, in the database's collation): "+
		"two transactions doing so in opposite orders deadlock. Record all of a transaction's events in one call, "+
		"or call in that order; nothing was written and the transaction is usable", strings.Join(names, ", "), ErrInsertOrder)
}

// InsertTx records events in tx, the caller's pgx transaction, and returns
// what was stored, in the order given. The events become visible to the relay
// when tx commits and vanish if it rolls back. Invalid events are refused
// with an error wrapping ErrInvalidEvent before anything is written (the
// transaction stays usable); on any other error the caller should roll tx
// back.
//
// Record all of a transaction's events in one call when you can. Each
// aggregate's counter row stays locked until tx ends, so that its sequences
// commit in order; one call locks the rows of all its aggregates in a fixed
// order (by aggregate type, then id), so writers cannot deadlock on them. A
// transaction may call InsertTx again, for aggregates it already wrote to
// and for aggregates that sort after all of those; a call that would lock an
// aggregate sorting before one the transaction holds is refused with
// ErrInsertOrder before it locks or writes anything (two transactions doing
// that in opposite orders would deadlock, and PostgreSQL would abort one
// after deadlock_timeout). The transaction records what it holds in a
// transaction-local setting (outbox.wrote).
func (w *Writer) InsertTx(ctx context.Context, tx pgx.Tx, events ...Event) ([]Recorded, error) {
	return w.insert(ctx, pgtx.Pgx(tx), events)
}

// InsertSQLTx is InsertTx for a database/sql transaction, so that code built
// on sqlx, GORM, bun or ent (with any PostgreSQL driver) records events in
// its own transaction. The same rules apply: one call per transaction when
// you can, and later calls only in aggregate order (ErrInsertOrder).
func (w *Writer) InsertSQLTx(ctx context.Context, tx *sql.Tx, events ...Event) ([]Recorded, error) {
	return w.insert(ctx, pgtx.SQL(tx), events)
}

// insert is InsertTx and InsertSQLTx: the same statements on either kind of
// transaction (package pgtx), as the inbox, the side effects and the Admins
// run theirs.
func (w *Writer) insert(ctx context.Context, tx pgtx.Querier, events []Event) ([]Recorded, error) {
	tc := w.traceContext(ctx)
	later := false
	if len(events) == 1 {
		p, err := w.prepareOne(&events[0], tc)
		if err != nil {
			return nil, err
		}
		var rec Recorded
		err = tx.QueryRow(ctx, w.insertOne, p.args[:]...).Scan(&rec.ID, &rec.Sequence, &rec.OccurredAt)
		if err == nil {
			rec.OccurredAt = rec.OccurredAt.UTC()
			return []Recorded{rec}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, insertError(err)
		}
		// Not the transaction's first call: the statement for later calls
		// checks the order. The event keeps the id it was given.
		events, later = []Event{events[0]}, true
		events[0].ID = p.id
	}
	return w.insertMany(events, later, tc, func(q string, ids []uuid.UUID, args ...any) ([]Recorded, error) {
		r, err := tx.Query(ctx, q, args...)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		out, err := collect(r, ids)
		if err != nil {
			return nil, err
		}
		return out, r.Close()
	})
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
