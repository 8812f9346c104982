// Package inbox makes a consumer apply each delivered outbox event's business
// effect exactly once and in per-aggregate order, although the broker
// delivers at least once and may redeliver out of order.
//
// Handle runs one local transaction per delivery:
//
//  1. lock the (consumer, aggregate) high-water mark row in inbox_aggregates;
//     a sequence at or below it is a duplicate, one more than one above it is
//     early (an earlier event has not been applied yet), unless the events in
//     between were skipped by an operator (outbox.Message.SkippedFrom);
//  2. INSERT INTO processed_events ... ON CONFLICT DO NOTHING RETURNING:
//     no row back means a duplicate;
//  3. the caller's effect, in the same transaction;
//  4. advance the high-water mark and commit.
//
// Only after Handle returns should the caller acknowledge the message to the
// broker: Applied and Duplicate are acked, Early is negatively acknowledged
// (redelivered later, after the missing event arrived), with a delay that
// grows with the deliveries and is capped: [RedeliveryDelay], or a
// [Backoff] of the consumer's own, so that a gap costs a few deliveries a
// minute, not a hot loop. A crash anywhere
// before the commit leaves nothing behind; a crash after the commit but
// before the ack causes a redelivery that Handle reports as Duplicate.
//
// # Starting mid-stream
//
// By default the inbox is strict: the first event it applies of an aggregate is
// sequence 1, and an aggregate whose earlier events the consumer will never
// receive (it joined the stream late, or broker retention or a redelivery limit
// dropped them) stays Early forever. Three explicit ways set an aggregate's
// high-water mark without applying the events below it, and each is recorded
// on the mark row (start_kind, start_prior_mark, start_mark, started_at,
// start_reason, start_by), so an operator sees later where and why the
// consumer's history of the aggregate begins ([AggregateInfo.Start]):
//
//   - Config.StartAtFirstSeen: for an aggregate the consumer has no mark for
//     and whose history began before the consumer's start point (recorded
//     once per consumer, [Inbox.StartPoint]), the first event seen is
//     applied whatever its sequence ([StartFirstSeen]); an aggregate created
//     after that point is applied from sequence 1, whichever of its events
//     is handled first;
//   - [Inbox.Seed] and [Inbox.SeedTx]: the application sets the mark, e.g. in
//     the transaction that restores its state from a snapshot ([StartSeeded]);
//     a seed at 0 says the aggregate starts at sequence 1;
//   - [Admin.Resolve] (`outbox inbox resolve`): an operator moves a stuck
//     aggregate's mark past a gap, with a reason, audited ([StartResolved]).
//
// # Waiting on a gap
//
// The first Early of an aggregate records the wait on its mark row
// (waiting_since, waiting_for, waiting_seen); applying an event clears it.
// [Admin.Waiting] (`outbox inbox status`) lists the aggregates waiting and since
// when, and [Admin.Gauges] feeds the inbox_waiting_aggregates and
// inbox_oldest_waiting_age_seconds metrics. Recording costs one write per wait
// (and per lower sequence seen while waiting), not per redelivery, and nothing
// on the apply path.
//
// # Schema evolution
//
// Each event carries its payload's schema_version. When an event type's
// payload changes, register an upcaster per version step in [Upcasters]
// (v1 → v2, v2 → v3, ...) and process deliveries with [Inbox.HandleMessage]:
// the effect receives the message upgraded to the newest version, so events
// written before the change (still in the outbox, or replayed) are applied by
// the same, current code.
//
// # database/sql
//
// An application built on database/sql (sqlx, GORM, bun, ent, any
// PostgreSQL driver) builds its inbox with [NewSQL] over its *sql.DB and
// delivers with [Inbox.HandleSQL] or [Inbox.HandleMessageSQL]: the effect
// receives the delivery's *sql.Tx. [Inbox.SeedSQLTx] seeds in the caller's
// *sql.Tx, and [NewSQLAdmin] is the Admin over a *sql.DB. The statements,
// outcomes and errors are the pgx path's.
//
// # Metrics
//
// Config.Observer is told the outcome of every delivery; package outboxprom
// exports inbox_processed_total, inbox_duplicates_total and friends.
//
// # Tracing
//
// With an OpenTelemetry tracer provider (Config.TracerProvider, or the
// global one the application set), Handle and HandleMessage run in a
// CONSUMER span that continues the trace of the message's traceparent
// header, which the relay set to its publish span; the effect's ctx carries
// it. When ctx already holds a span of the same trace (a webhook
// Receiver's), the inbox span is its child; a span of another trace is
// linked.
package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
	"github.com/pgoutbox/outbox/internal/tracing"
	"go.opentelemetry.io/otel/trace"
)

// Outcome says what Handle did with a delivery.
type Outcome int

const (
	// Applied: the effect ran and committed with the inbox rows.
	Applied Outcome = iota + 1
	// Duplicate: the event had been applied before; nothing ran. Ack it.
	Duplicate
	// Early: an earlier event of the aggregate has not been applied yet;
	// nothing ran. Let the broker redeliver it later.
	Early
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Early:
		return "early"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Config configures an Inbox.
type Config struct {
	// Consumer names the consumer; each consumer has its own inbox rows and
	// high-water marks. Required.
	Consumer string
	// Schema is the PostgreSQL schema holding the inbox tables, as a plain
	// string: the older field, kept working; prefer Tables. Defaults to
	// "outbox".
	Schema string
	// Tables is the schema holding the inbox tables: the one outbox.Schema value
	// an application gives every component's config. Setting it and Schema
	// to different names is refused (outbox.ErrSchemaConflict). Defaults to
	// Schema, then "outbox".
	Tables outbox.Schema
	// Upcasters upgrade old payloads before HandleMessage hands a message to
	// its effect. Optional.
	Upcasters *Upcasters
	// Observer is told the outcome of every Handle and HandleMessage call,
	// for metrics (see package outboxprom). Optional.
	Observer Observer
	// StartAtFirstSeen makes a consumer that joins a stream mid-way start
	// each aggregate whose history began before the consumer did at the
	// first event it sees, instead of waiting (Early) for sequence 1, which
	// may never come. The consumer's start point is recorded once, the
	// first time it handles an event with StartAtFirstSeen (or calls
	// StartPoint): a row in inbox_consumers. Then, for an aggregate it has
	// no high-water mark for (it never applied, nor was seeded with, an
	// event of it), an event past sequence 1:
	//
	//   - that occurred before the start point (OccurredAt, or the time in a
	//     UUIDv7 event id; an event with neither counts as before; the start
	//     point is taken back to the oldest transaction open when it was
	//     recorded, so that the events of a writer transaction open across
	//     it, which occurred before it but commit after it, are not) is
	//     applied whatever its sequence: the aggregate began before the
	//     consumer, its earlier events may never be delivered;
	//   - that occurred after it is Early, like in a strict consumer: the
	//     aggregate may have begun after the start, and then its sequence 1
	//     was delivered before this event (the relay publishes an
	//     aggregate's events in order) and is only being handled later (by
	//     another worker, or after a failure). Only when no earlier event
	//     has been applied StartGrace after the first Early is the aggregate
	//     started at the lowest sequence seen meanwhile: it began before the
	//     consumer after all, its earlier events published before the
	//     consumer's subscription began.
	//
	// A start is recorded on the mark row (start_kind "first_seen",
	// start_mark = that sequence - 1, started_at, start_reason =
	// StartReason). An aggregate whose first event applied is sequence 1
	// starts normally and records nothing; so does one seeded at 0 (Seed).
	//
	// The events of an aggregate below its start are never applied: if the
	// broker delivers an aggregate that began before the start point out of
	// order (a redelivery after a nak, two workers), an earlier one arriving
	// second is dropped as a Duplicate. Use it for consumers that only need
	// the events from now on; to start from a known state, use Seed
	// instead. An aggregate already started keeps its strict order: a later
	// gap is still Early.
	//
	// Defaults to false: strict, an aggregate starts at sequence 1.
	StartAtFirstSeen bool
	// StartGrace is how long, with StartAtFirstSeen, an aggregate new to the
	// consumer whose first event seen occurred after the consumer's start
	// point waits for its earlier events (Early) before it is started at
	// the lowest sequence seen. It must exceed the longest time an event
	// already delivered can take to be applied (its retries, a worker's
	// crash and the redelivery after the broker's ack wait). Defaults to
	// StartGraceDefault.
	StartGrace time.Duration
	// StartReason is recorded as the reason of every aggregate started by
	// StartAtFirstSeen, e.g. "consumer deployed 2026-12-01, history not
	// needed". Defaults to StartReasonDefault.
	StartReason string
	// TracerProvider receives a CONSUMER span per Handle or HandleMessage
	// call, covering the transaction and the effect: it continues the
	// trace of the message's traceparent header (the relay's publish span),
	// and the effect's ctx carries it, so business code can add child spans.
	// Its outbox.inbox.outcome attribute is the Outcome ("applied",
	// "duplicate", "early"). Nil means otel.GetTracerProvider() (read, never
	// set), a no-op unless the application configured one. Defaults to nil.
	TracerProvider trace.TracerProvider
}

// StartGraceDefault is Config.StartGrace's default.
const StartGraceDefault = 5 * time.Minute

// startSkew is how much earlier than the consumer's start point an event
// must have occurred to count as before it: the start point is the inbox
// database's clock, an event's time the writer's. An event within it waits
// as one after the start (the safe side).
const startSkew = time.Minute

// recordStartSQL records a consumer's start point once: the earlier of now
// and the start of the oldest transaction open in the database cluster at
// that moment. An event's occurred_at is its writer transaction's start,
// not its commit: a transaction open since before the consumer's start
// commits its events after it, and they reach the consumer. Taking the
// start point back to before every open transaction keeps such events on
// the "after the start" side (held to their predecessors), whatever the
// transaction's length. Sessions whose xact_start the role cannot read
// (another role's, without pg_read_all_stats) are not seen.
const recordStartSQL = `WITH ins AS (
	INSERT INTO %[1]s (consumer_name, started_at)
	VALUES ($1, least(now(), (SELECT min(xact_start) FROM pg_catalog.pg_stat_activity
		WHERE xact_start IS NOT NULL AND backend_type = 'client backend')))
	ON CONFLICT (consumer_name) DO NOTHING RETURNING started_at
)
SELECT started_at FROM ins UNION ALL SELECT started_at FROM %[1]s WHERE consumer_name = $1 LIMIT 1`

// StartReasonDefault is the reason recorded for an aggregate started at its
// first seen event when Config.StartReason is empty.
const StartReasonDefault = "consumer started mid-stream: took the first event seen as the start (Config.StartAtFirstSeen)"

// Observer is told the outcome of every delivery the inbox handled. It is
// called synchronously after the transaction ended and must be safe for
// concurrent use and fast.
type Observer interface {
	ObserveHandle(HandleObservation)
}

// HandleObservation describes one handled delivery.
type HandleObservation struct {
	// Consumer is the inbox's consumer name.
	Consumer string
	// AggregateType and EventType identify the kind of event.
	AggregateType string
	EventType     string
	// Outcome is what was done; zero when Err is set.
	Outcome Outcome
	// Err is the error Handle returned (the effect's, or the database's).
	Err error
	// Duration is the time Handle took, transaction included.
	Duration time.Duration
}

// Inbox deduplicates and orders deliveries for one consumer. It is safe for
// concurrent use; deliveries of the same aggregate serialise on their
// high-water mark row.
type Inbox struct {
	db          pgtx.DB
	sqlDB       bool // built by NewSQL: its deliveries run in database/sql transactions
	consumer    string
	up          *Upcasters
	observer    Observer
	firstSeen   bool
	startReason string
	startGrace  time.Duration
	startMu     sync.Mutex
	startPoint  time.Time // the consumer's start point, once read
	startSkew   time.Duration
	recordStart string
	tracer      trace.Tracer // nil: tracing off
	lockMark    string
	insert      string
	advance     string
	advanceWait string // advance, and clear the wait of a waiting aggregate
	startFirst  string // advance, recording a first-seen start
	wait        string // record a wait
	seed        string
	seedZero    string // a seed at 0: strict from sequence 1, the wait kept
	marks       string
}

// New returns an Inbox over pool, whose Handle and HandleMessage run each
// delivery in a pgx transaction.
func New(pool *pgxpool.Pool, cfg Config) (*Inbox, error) {
	if pool == nil {
		return nil, errors.New("inbox: New needs a pool")
	}
	return newInbox(pgtx.Pool(pool), false, cfg)
}

// NewSQL returns an Inbox over db, a database/sql database (the one sqlx,
// GORM, bun or ent hand out, over any PostgreSQL driver), whose HandleSQL
// and HandleMessageSQL run each delivery in a database/sql transaction. It
// is the same inbox as New's: the same tables, statements, outcomes and
// errors; only the kind of transaction the effect receives differs.
func NewSQL(db *sql.DB, cfg Config) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("inbox: NewSQL needs a database")
	}
	return newInbox(pgtx.Database(db), true, cfg)
}

func newInbox(db pgtx.DB, sqlDB bool, cfg Config) (*Inbox, error) {
	if cfg.Consumer == "" {
		return nil, errors.New("inbox: Config.Consumer is required")
	}
	s, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	if cfg.StartReason == "" {
		cfg.StartReason = StartReasonDefault
	}
	if cfg.StartGrace < 0 {
		return nil, errors.New("inbox: Config.StartGrace must not be negative")
	}
	if cfg.StartGrace == 0 {
		cfg.StartGrace = StartGraceDefault
	}
	consumers := s.Table("inbox_consumers")
	marks := s.Table("inbox_aggregates")
	const where = `
WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3`
	const clearWait = `, waiting_since = NULL, waiting_for = NULL, waiting_seen = NULL`
	return &Inbox{
		db:          db,
		sqlDB:       sqlDB,
		marks:       marks,
		consumer:    cfg.Consumer,
		up:          cfg.Upcasters,
		observer:    cfg.Observer,
		firstSeen:   cfg.StartAtFirstSeen,
		startReason: cfg.StartReason,
		startGrace:  cfg.StartGrace,
		// The first recording wins; a concurrent one that lost reads it.
		recordStart: fmt.Sprintf(recordStartSQL, consumers),
		startSkew:   startSkew,
		tracer:      tracing.Tracer(cfg.TracerProvider),
		lockMark:    lockMarkSQL(marks),
		insert: `INSERT INTO ` + s.Table("processed_events") + ` (consumer_name, event_id) VALUES ($1, $2)
ON CONFLICT DO NOTHING RETURNING true`,
		advance:     `UPDATE ` + marks + ` SET last_sequence = $4, updated_at = now()` + where,
		advanceWait: `UPDATE ` + marks + ` SET last_sequence = $4, updated_at = now()` + clearWait + where,
		startFirst: `UPDATE ` + marks + ` SET last_sequence = $4, updated_at = now()` + clearWait + `,
	start_kind = 'first_seen', start_prior_mark = 0, start_mark = $4::bigint - 1, started_at = now(), start_reason = $5, start_by = NULL` + where,
		// The first early delivery of a wait sets waiting_since; a lower
		// sequence seen later lowers waiting_seen (resolving then passes over
		// fewer events).
		wait: `UPDATE ` + marks + ` SET waiting_since = coalesce(waiting_since, now()), waiting_for = $4, waiting_seen = $5` + where,
		seed: `UPDATE ` + marks + ` SET last_sequence = $4, updated_at = now()` + clearWait + `,
	start_kind = 'seeded', start_prior_mark = $5, start_mark = $4, started_at = now(), start_reason = $6, start_by = NULL` + where,
		seedZero: `UPDATE ` + marks + ` SET updated_at = now(),
	start_kind = 'seeded', start_prior_mark = 0, start_mark = 0, started_at = now(), start_reason = $4, start_by = NULL` + where,
	}, nil
}

// lockMarkSQL locks a (consumer, aggregate) mark row, creating it at 0 when
// missing. The no-op update takes the row lock even when the row exists, so
// concurrent deliveries of one aggregate (and seeds and resolves) serialise
// here. It returns the mark, the lowest sequence seen while waiting on a gap
// (NULL when not waiting), for how long it has waited, and whether a start
// was recorded.
func lockMarkSQL(marks string) string {
	return `INSERT INTO ` + marks + ` AS m (consumer_name, aggregate_type, aggregate_id, last_sequence)
VALUES ($1, $2, $3, 0)
ON CONFLICT (consumer_name, aggregate_type, aggregate_id) DO UPDATE SET last_sequence = m.last_sequence
RETURNING last_sequence, waiting_seen, coalesce(extract(epoch FROM now() - waiting_since), 0)::float8, start_kind IS NOT NULL`
}

// markState is what lockMarkSQL returns.
type markState struct {
	last        int64
	waitingSeen *int64
	waitedSecs  float64
	started     bool
}

func lockMark(ctx context.Context, tx pgtx.Querier, sql, consumer, aggregateType, aggregateID string) (markState, error) {
	var m markState
	err := tx.QueryRow(ctx, sql, consumer, aggregateType, aggregateID).Scan(&m.last, &m.waitingSeen, &m.waitedSecs, &m.started)
	return m, err
}

// StartPoint returns the consumer's start point: when it first handled an
// event with Config.StartAtFirstSeen (or first called StartPoint), by the
// database's clock, taken back to the start of the oldest transaction then
// open in the database cluster (an event's time is its writer
// transaction's start, and a transaction open at that moment commits its
// events after it), recorded once per consumer name in inbox_consumers and
// never moved. Events that occurred before it may belong to aggregates the
// consumer joined mid-stream; an aggregate whose first event seen occurred
// after it is held to sequence 1 first (Config.StartAtFirstSeen). Call it
// when the consumer is deployed to make that moment its start point rather
// than its first delivery.
func (in *Inbox) StartPoint(ctx context.Context) (time.Time, error) {
	in.startMu.Lock()
	defer in.startMu.Unlock()
	if !in.startPoint.IsZero() {
		return in.startPoint, nil
	}
	var at time.Time
	var err error
	for range 3 { // a concurrent first recording committed after our snapshot: read again
		err = in.db.QueryRow(ctx, in.recordStart, in.consumer).Scan(&at)
		if !errors.Is(err, pgx.ErrNoRows) {
			break
		}
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("inbox: consumer %s: record its start point: %w", in.consumer, err)
	}
	in.startPoint = at
	return at, nil
}

// occurred is when msg's event occurred: its OccurredAt, else the time in
// its id when that is a UUIDv7; zero when neither says.
func occurred(msg outbox.Message) time.Time {
	if !msg.OccurredAt.IsZero() {
		return msg.OccurredAt
	}
	if msg.ID.Version() == 7 {
		sec, nsec := msg.ID.Time().UnixTime()
		return time.Unix(sec, nsec)
	}
	return time.Time{}
}

// Consumer is the consumer name the inbox records under.
func (in *Inbox) Consumer() string { return in.consumer }

// Handle applies msg's effect at most once, in sequence order, in one
// transaction with the inbox rows. apply runs inside that transaction and
// must do all its database work through tx; when it returns an error, nothing
// is committed and Handle returns that error (the caller should let the
// broker redeliver). See the package documentation for the outcomes. Handle
// needs an Inbox built by New; one built by NewSQL has HandleSQL.
func (in *Inbox) Handle(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx pgx.Tx) error) (Outcome, error) {
	if in.sqlDB {
		return 0, errKind("Handle", "NewSQL", "HandleSQL")
	}
	return in.handleObserved(ctx, msg, func(ctx context.Context, tx pgtx.Querier) error {
		t, _ := pgtx.PgxOf(tx)
		return apply(ctx, t)
	})
}

// HandleSQL is Handle for an Inbox built by NewSQL: the delivery runs in a
// database/sql transaction, which apply receives, with the same outcomes
// and errors as Handle.
func (in *Inbox) HandleSQL(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	if !in.sqlDB {
		return 0, errKind("HandleSQL", "New", "Handle")
	}
	return in.handleObserved(ctx, msg, func(ctx context.Context, tx pgtx.Querier) error {
		t, _ := pgtx.SQLOf(tx)
		return apply(ctx, t)
	})
}

// errKind is the error of a Handle method called on an Inbox built for the
// other kind of transaction.
func errKind(method, builtBy, instead string) error {
	return fmt.Errorf("inbox: %s on an Inbox built by %s, whose deliveries run in the other kind of transaction: call %s", method, builtBy, instead)
}

func (in *Inbox) handleObserved(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx pgtx.Querier) error) (Outcome, error) {
	start := time.Now()
	ctx, span := in.startSpan(ctx, msg)
	outcome, err := in.handle(ctx, msg, apply)
	endSpan(span, outcome, err)
	in.observe(msg, start, outcome, err)
	return outcome, err
}

// HandleMessage is Handle for an effect that reads the message: it upgrades
// msg with Config.Upcasters to the newest schema version of its type, then
// applies the effect, which receives the upgraded message, at most once, in
// order, in one transaction with the inbox rows. An upcaster's error is
// returned without touching the database (the broker should redeliver).
func (in *Inbox) HandleMessage(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx pgx.Tx, msg outbox.Message) error) (Outcome, error) {
	if in.sqlDB {
		return 0, errKind("HandleMessage", "NewSQL", "HandleMessageSQL")
	}
	return in.handleUpcast(ctx, msg, func(ctx context.Context, tx pgtx.Querier, msg outbox.Message) error {
		t, _ := pgtx.PgxOf(tx)
		return apply(ctx, t, msg)
	})
}

// HandleMessageSQL is HandleMessage for an Inbox built by NewSQL: the
// effect receives the upgraded message and the delivery's database/sql
// transaction.
func (in *Inbox) HandleMessageSQL(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx *sql.Tx, msg outbox.Message) error) (Outcome, error) {
	if !in.sqlDB {
		return 0, errKind("HandleMessageSQL", "New", "HandleMessage")
	}
	return in.handleUpcast(ctx, msg, func(ctx context.Context, tx pgtx.Querier, msg outbox.Message) error {
		t, _ := pgtx.SQLOf(tx)
		return apply(ctx, t, msg)
	})
}

func (in *Inbox) handleUpcast(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx pgtx.Querier, msg outbox.Message) error) (Outcome, error) {
	start := time.Now()
	ctx, span := in.startSpan(ctx, msg)
	upgraded, err := in.up.Upcast(msg)
	if err != nil {
		endSpan(span, 0, err)
		in.observe(msg, start, 0, err)
		return 0, err
	}
	outcome, err := in.handle(ctx, upgraded, func(ctx context.Context, tx pgtx.Querier) error { return apply(ctx, tx, upgraded) })
	endSpan(span, outcome, err)
	in.observe(msg, start, outcome, err)
	return outcome, err
}

func (in *Inbox) observe(msg outbox.Message, start time.Time, outcome Outcome, err error) {
	if in.observer == nil {
		return
	}
	if err != nil {
		outcome = 0
	}
	in.observer.ObserveHandle(HandleObservation{
		Consumer: in.consumer, AggregateType: msg.AggregateType, EventType: msg.Type,
		Outcome: outcome, Err: err, Duration: time.Since(start),
	})
}

func (in *Inbox) handle(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx pgtx.Querier) error) (Outcome, error) {
	if msg.AggregateType == "" || msg.AggregateID == "" || msg.Sequence < 1 {
		return 0, fmt.Errorf("inbox: message %s lacks its aggregate type, id or sequence", msg.ID)
	}
	var startPoint time.Time
	if in.firstSeen {
		// Read (once per Inbox) before the transaction: never a second
		// connection while one is held.
		var err error
		if startPoint, err = in.StartPoint(ctx); err != nil {
			return 0, err
		}
	}
	var outcome Outcome
	err := in.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		mark, err := lockMark(ctx, tx, in.lockMark, in.consumer, msg.AggregateType, msg.AggregateID)
		if err != nil {
			return fmt.Errorf("inbox: lock high-water mark: %w", err)
		}
		last := mark.last
		// Every event in between was skipped by an operator and will never
		// come.
		skipped := msg.SkippedFrom >= 1 && msg.SkippedFrom <= last+1
		// An aggregate the consumer has no mark for may start at this
		// event: see Config.StartAtFirstSeen.
		firstSeen := in.firstSeen && last == 0 && !mark.started && msg.Sequence > 1 && !skipped
		reason := in.startReason
		if firstSeen {
			at := occurred(msg)
			switch {
			case at.IsZero() || at.Before(startPoint.Add(-in.startSkew)):
				// Its history began before the consumer's start.
			case mark.waitingSeen != nil && mark.waitedSecs >= in.startGrace.Seconds() && msg.Sequence <= *mark.waitingSeen:
				reason += fmt.Sprintf("; no event before #%d came within %s (StartGrace) of its first delivery, although it occurred after the consumer's start",
					msg.Sequence, in.startGrace)
			default:
				// Maybe new since the start: its sequence 1 was delivered
				// first and is being handled, or comes again.
				firstSeen = false
			}
		}
		switch {
		case msg.Sequence <= last:
			outcome = Duplicate
			return errRollback
		case msg.Sequence > last+1 && !skipped && !firstSeen:
			outcome = Early
			if mark.waitingSeen != nil && *mark.waitingSeen <= msg.Sequence {
				return errRollback // the wait is recorded already
			}
			return in.recordWait(ctx, tx, msg, last)
		}
		var inserted bool
		err = tx.QueryRow(ctx, in.insert, in.consumer, msg.ID).Scan(&inserted)
		if errors.Is(err, pgx.ErrNoRows) {
			outcome = Duplicate
			return errRollback
		}
		if err != nil {
			return fmt.Errorf("inbox: record event: %w", err)
		}
		if err := apply(ctx, tx); err != nil {
			return err
		}
		args := []any{in.consumer, msg.AggregateType, msg.AggregateID, msg.Sequence}
		advance := in.advance
		switch {
		case firstSeen:
			advance, args = in.startFirst, append(args, reason)
		case mark.waitingSeen != nil:
			advance = in.advanceWait
		}
		if _, err := tx.Exec(ctx, advance, args...); err != nil {
			return fmt.Errorf("inbox: advance high-water mark: %w", err)
		}
		outcome = Applied
		return nil
	})
	if errors.Is(err, errRollback) {
		return outcome, nil
	}
	if err != nil {
		return 0, err
	}
	return outcome, nil
}

// recordWait records on the mark row that the aggregate waits on a gap: it
// expected last+1 and saw msg. The record is for monitoring only (a crash
// losing it is repaired by the next early delivery), so its commit does not
// wait for the WAL flush. One round trip.
func (in *Inbox) recordWait(ctx context.Context, tx pgtx.Querier, msg outbox.Message, last int64) error {
	err := tx.ExecAll(ctx, pgtx.Stmt{SQL: `SET LOCAL synchronous_commit TO off`},
		pgtx.Stmt{SQL: in.wait, Args: []any{in.consumer, msg.AggregateType, msg.AggregateID, last + 1, msg.Sequence}})
	if err != nil {
		return fmt.Errorf("inbox: record wait: %w", err)
	}
	return nil
}

// Seed sets the consumer's high-water mark of an aggregate to lastApplied, in
// a transaction of its own: the events up to lastApplied count as applied
// (later deliveries of them are Duplicate) and the next one applied is
// lastApplied+1. See SeedTx.
func (in *Inbox) Seed(ctx context.Context, aggregateType, aggregateID string, lastApplied int64, reason string) error {
	return in.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		return in.seedTx(ctx, tx, aggregateType, aggregateID, lastApplied, reason)
	})
}

// SeedTx sets the consumer's high-water mark of an aggregate to lastApplied
// in the caller's transaction: typically the one that restores the
// consumer's state from a snapshot taken at lastApplied, so that the state
// and the mark commit together. The events up to lastApplied count as
// applied (later deliveries of them are Duplicate) and the next one applied
// is lastApplied+1. The seed is recorded on the mark row (start_kind
// "seeded", start_prior_mark, start_mark, started_at, start_reason) and ends
// a wait on a gap.
//
// reason is required (ErrReasonRequired). A mark never goes back: seeding
// below the current mark returns ErrMarkAhead (the consumer applied later
// events already), and seeding at the current mark does nothing, but for
// one: seeding an aggregate the consumer has applied nothing of at 0 says
// that its history starts at sequence 1 (it is new, or the consumer needs
// all of it). It is recorded as a seed at 0 (start_kind "seeded",
// start_mark 0), and the aggregate is then strict even under
// Config.StartAtFirstSeen: it waits for sequence 1 whatever it sees first.
func (in *Inbox) SeedTx(ctx context.Context, tx pgx.Tx, aggregateType, aggregateID string, lastApplied int64, reason string) error {
	return in.seedTx(ctx, pgtx.Pgx(tx), aggregateType, aggregateID, lastApplied, reason)
}

// SeedSQLTx is SeedTx for a database/sql transaction (sqlx, GORM, bun, ent),
// with the same rules and errors. It works on an Inbox built by New or by
// NewSQL: the transaction is the caller's.
func (in *Inbox) SeedSQLTx(ctx context.Context, tx *sql.Tx, aggregateType, aggregateID string, lastApplied int64, reason string) error {
	return in.seedTx(ctx, pgtx.SQL(tx), aggregateType, aggregateID, lastApplied, reason)
}

func (in *Inbox) seedTx(ctx context.Context, tx pgtx.Querier, aggregateType, aggregateID string, lastApplied int64, reason string) error {
	switch {
	case aggregateType == "" || aggregateID == "":
		return errors.New("inbox: seed: the aggregate type and id are required")
	case lastApplied < 0:
		return fmt.Errorf("inbox: seed %s/%s: last applied sequence %d is negative", aggregateType, aggregateID, lastApplied)
	case reason == "":
		return fmt.Errorf("inbox: seed %s/%s: %w", aggregateType, aggregateID, ErrReasonRequired)
	}
	mark, err := lockMark(ctx, tx, in.lockMark, in.consumer, aggregateType, aggregateID)
	if err != nil {
		return fmt.Errorf("inbox: seed %s/%s: lock high-water mark: %w", aggregateType, aggregateID, err)
	}
	switch {
	case lastApplied < mark.last:
		return fmt.Errorf("inbox: seed %s/%s at %d: %w (consumer %s is at %d)", aggregateType, aggregateID, lastApplied, ErrMarkAhead, in.consumer, mark.last)
	case lastApplied == 0 && !mark.started:
		if _, err := tx.Exec(ctx, in.seedZero, in.consumer, aggregateType, aggregateID, reason); err != nil {
			return fmt.Errorf("inbox: seed %s/%s: %w", aggregateType, aggregateID, err)
		}
		return nil
	case lastApplied == mark.last:
		return nil
	}
	if _, err := tx.Exec(ctx, in.seed, in.consumer, aggregateType, aggregateID, lastApplied, mark.last, reason); err != nil {
		return fmt.Errorf("inbox: seed %s/%s: %w", aggregateType, aggregateID, err)
	}
	return nil
}

// errRollback ends the transaction without an error for the caller.
var errRollback = errors.New("inbox: rollback")

// LastSequence returns the last sequence of the aggregate the consumer has
// applied (0 when none).
func (in *Inbox) LastSequence(ctx context.Context, aggregateType, aggregateID string) (int64, error) {
	var last int64
	err := in.db.QueryRow(ctx, `SELECT coalesce((SELECT last_sequence FROM `+in.marks+`
WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3), 0)`, in.consumer, aggregateType, aggregateID).Scan(&last)
	return last, err
}
