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
// (redelivered later, after the missing event arrived). A crash anywhere
// before the commit leaves nothing behind; a crash after the commit but
// before the ack causes a redelivery that Handle reports as Duplicate.
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
// # Metrics
//
// Config.Observer is told the outcome of every delivery; package outboxprom
// exports inbox_processed_total, inbox_duplicates_total and friends.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
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
	// Schema is the PostgreSQL schema holding the inbox tables. Defaults to
	// "outbox".
	Schema string
	// Upcasters upgrade old payloads before HandleMessage hands a message to
	// its effect. Optional.
	Upcasters *Upcasters
	// Observer is told the outcome of every Handle and HandleMessage call,
	// for metrics (see package outboxprom). Optional.
	Observer Observer
}

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
	pool     *pgxpool.Pool
	consumer string
	up       *Upcasters
	observer Observer
	lockMark string
	insert   string
	advance  string
	marks    string
}

// New returns an Inbox over pool.
func New(pool *pgxpool.Pool, cfg Config) (*Inbox, error) {
	if pool == nil {
		return nil, errors.New("inbox: New needs a pool")
	}
	if cfg.Consumer == "" {
		return nil, errors.New("inbox: Config.Consumer is required")
	}
	s, err := pgident.NewSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	marks := s.Table("inbox_aggregates")
	return &Inbox{
		pool:     pool,
		marks:    marks,
		consumer: cfg.Consumer,
		up:       cfg.Upcasters,
		observer: cfg.Observer,
		// The no-op update takes the row lock even when the row exists, so
		// concurrent deliveries of one aggregate serialise here.
		lockMark: `INSERT INTO ` + marks + ` AS m (consumer_name, aggregate_type, aggregate_id, last_sequence)
VALUES ($1, $2, $3, 0)
ON CONFLICT (consumer_name, aggregate_type, aggregate_id) DO UPDATE SET last_sequence = m.last_sequence
RETURNING last_sequence`,
		insert: `INSERT INTO ` + s.Table("processed_events") + ` (consumer_name, event_id) VALUES ($1, $2)
ON CONFLICT DO NOTHING RETURNING true`,
		advance: `UPDATE ` + marks + ` SET last_sequence = $4, updated_at = now()
WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
	}, nil
}

// Consumer is the consumer name the inbox records under.
func (in *Inbox) Consumer() string { return in.consumer }

// Handle applies msg's effect at most once, in sequence order, in one
// transaction with the inbox rows. apply runs inside that transaction and
// must do all its database work through tx; when it returns an error, nothing
// is committed and Handle returns that error (the caller should let the
// broker redeliver). See the package documentation for the outcomes.
func (in *Inbox) Handle(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx pgx.Tx) error) (Outcome, error) {
	start := time.Now()
	outcome, err := in.handle(ctx, msg, apply)
	in.observe(msg, start, outcome, err)
	return outcome, err
}

// HandleMessage is Handle for an effect that reads the message: it upgrades
// msg with Config.Upcasters to the newest schema version of its type, then
// applies the effect, which receives the upgraded message, at most once, in
// order, in one transaction with the inbox rows. An upcaster's error is
// returned without touching the database (the broker should redeliver).
func (in *Inbox) HandleMessage(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx pgx.Tx, msg outbox.Message) error) (Outcome, error) {
	start := time.Now()
	upgraded, err := in.up.Upcast(msg)
	if err != nil {
		in.observe(msg, start, 0, err)
		return 0, err
	}
	outcome, err := in.handle(ctx, upgraded, func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, upgraded) })
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

func (in *Inbox) handle(ctx context.Context, msg outbox.Message, apply func(ctx context.Context, tx pgx.Tx) error) (Outcome, error) {
	if msg.AggregateType == "" || msg.AggregateID == "" || msg.Sequence < 1 {
		return 0, fmt.Errorf("inbox: message %s lacks its aggregate type, id or sequence", msg.ID)
	}
	var outcome Outcome
	err := pgx.BeginFunc(ctx, in.pool, func(tx pgx.Tx) error {
		var last int64
		if err := tx.QueryRow(ctx, in.lockMark, in.consumer, msg.AggregateType, msg.AggregateID).Scan(&last); err != nil {
			return fmt.Errorf("inbox: lock high-water mark: %w", err)
		}
		switch {
		case msg.Sequence <= last:
			outcome = Duplicate
			return errRollback
		case msg.Sequence > last+1 && (msg.SkippedFrom < 1 || msg.SkippedFrom > last+1):
			// Early, unless every event in between was skipped by an
			// operator and will never come.
			outcome = Early
			return errRollback
		}
		var inserted bool
		err := tx.QueryRow(ctx, in.insert, in.consumer, msg.ID).Scan(&inserted)
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
		if _, err := tx.Exec(ctx, in.advance, in.consumer, msg.AggregateType, msg.AggregateID, msg.Sequence); err != nil {
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

// errRollback ends the transaction without an error for the caller.
var errRollback = errors.New("inbox: rollback")

// LastSequence returns the last sequence of the aggregate the consumer has
// applied (0 when none).
func (in *Inbox) LastSequence(ctx context.Context, aggregateType, aggregateID string) (int64, error) {
	var last int64
	err := in.pool.QueryRow(ctx, `SELECT coalesce((SELECT last_sequence FROM `+in.marks+`
WHERE consumer_name = $1 AND aggregate_type = $2 AND aggregate_id = $3), 0)`, in.consumer, aggregateType, aggregateID).Scan(&last)
	return last, err
}
