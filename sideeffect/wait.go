package sideeffect

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgtext"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Wait says that a consumer's event waits on a parked attempt of the
// Caller: what Caller.WaitTx records.
type Wait struct {
	// Consumer names the consumer whose event waits (its inbox's consumer
	// name, say); Resume takes up the waits of the consumer it is given.
	// Required.
	Consumer string
	// Key is the attempt's key: the one Do returned ErrParked for.
	// Required.
	Key string
	// Message is the delivered message, stored to be handed back to
	// Resume's handler as it is (the payload's exact bytes, the headers,
	// the aggregate and sequence). Its ID identifies the waiting event and
	// is required.
	Message outbox.Message
}

// ErrMessageNotStorable is wrapped by WaitTx's refusal of a message holding
// text PostgreSQL cannot store as given: a NUL byte, or bytes that are not
// UTF-8, in a header's name or value, or in the message's type, aggregate
// type, aggregate id or content type (or in Wait.Consumer or Wait.Key); or
// a schema version or occurred-at time outside PostgreSQL's integer or
// timestamptz range.
// The outbox writer refuses such text in an event (outbox.ErrInvalidEvent:
// a header value holds no control character and is UTF-8), so a message
// that holds it was not delivered as an outbox writer wrote it (another
// producer on the stream, a header added on the way). WaitTx checks before
// it runs any statement: nothing is written and tx is as it was, so the
// consumer may drop or clean the field and call WaitTx again in the same
// transaction.
var ErrMessageNotStorable = errors.New("the message holds text PostgreSQL cannot store as given (a NUL byte, or bytes that are not UTF-8)")

// WaitTx records, in tx (the event's inbox transaction), that w.Message
// waits on the parked attempt w.Key of the Caller, so that the consumer
// can acknowledge the delivery instead of having it redelivered while Do
// can only answer ErrParked. Once the attempt is no longer parked (an
// operator resolved it), Resume hands the message back to the consumer's
// handler, which calls Do again with the same key and request: it returns
// the operator's outcome or, after ResolveRetry, calls once.
//
// An event waits on one attempt at a time: recording a wait again for the
// same consumer and event replaces the attempt it waits on, and a handler
// run by Resume that records the wait again (it found the attempt parked
// again) keeps it waiting. The wait commits or rolls back with tx.
//
// Committing tx applies the event as far as the inbox is concerned: a
// redelivery is a Duplicate, and the aggregate's later events are applied
// without waiting for this one's effect. Record in tx, besides the wait,
// whatever the later events must know of it (the example's payments row
// says charge_parked).
//
// The message is stored as given, or not at all: one holding a NUL byte
// or bytes that are not UTF-8 in a header or another text field is refused
// with ErrMessageNotStorable before anything is run in tx.
func (c *Caller) WaitTx(ctx context.Context, tx pgx.Tx, w Wait) error {
	if tx == nil {
		return errors.New("sideeffect: WaitTx needs a transaction")
	}
	return c.wait(ctx, pgtx.Pgx(tx), w)
}

// WaitSQLTx is WaitTx for a database/sql transaction (sqlx, GORM, bun,
// ent). It works on a Caller built by New or by NewSQL: the transaction is
// the caller's.
func (c *Caller) WaitSQLTx(ctx context.Context, tx *sql.Tx, w Wait) error {
	if tx == nil {
		return errors.New("sideeffect: WaitSQLTx needs a transaction")
	}
	return c.wait(ctx, pgtx.SQL(tx), w)
}

func (c *Caller) wait(ctx context.Context, tx pgtx.Querier, w Wait) error {
	if err := checkName("Wait.Consumer", w.Consumer); err != nil {
		return err
	}
	if err := checkName("Wait.Key", w.Key); err != nil {
		return err
	}
	m := w.Message
	if m.ID == uuid.Nil {
		return errors.New("sideeffect: Wait.Message has no ID")
	}
	if err := storable(w); err != nil {
		return fmt.Errorf("sideeffect %s, key %s: record that event %s of consumer %s waits: %w", c.cfg.Name, w.Key, m.ID, w.Consumer, err)
	}
	headers := "{}"
	if len(m.Headers) > 0 {
		b, err := json.Marshal(m.Headers)
		if err != nil {
			return fmt.Errorf("sideeffect: wait: headers: %w", err)
		}
		headers = string(b)
	}
	var occurred *time.Time
	if !m.OccurredAt.IsZero() {
		occurred = &m.OccurredAt
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+c.waits+` AS w (consumer_name, event_id, name, key, aggregate_type, aggregate_id, sequence,
	event_type, schema_version, content_type, payload, headers, occurred_at, skipped_from)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, coalesce($11, ''::bytea), $12::text::jsonb, $13, $14)
ON CONFLICT (consumer_name, event_id) DO UPDATE SET name = excluded.name, key = excluded.key,
	aggregate_type = excluded.aggregate_type, aggregate_id = excluded.aggregate_id, sequence = excluded.sequence,
	event_type = excluded.event_type, schema_version = excluded.schema_version, content_type = excluded.content_type,
	payload = excluded.payload, headers = excluded.headers, occurred_at = excluded.occurred_at, skipped_from = excluded.skipped_from,
	waiting_since = CASE WHEN (w.name, w.key) = (excluded.name, excluded.key) THEN w.waiting_since ELSE now() END,
	recorded = w.recorded + 1, next_wake_at = now()`,
		w.Consumer, m.ID, c.cfg.Name, w.Key, m.AggregateType, m.AggregateID, m.Sequence,
		m.Type, m.SchemaVersion, m.ContentType, m.Payload, headers, occurred, m.SkippedFrom)
	if err != nil {
		return fmt.Errorf("sideeffect %s, key %s: record that event %s of consumer %s waits: %w", c.cfg.Name, w.Key, m.ID, w.Consumer, err)
	}
	return nil
}

// PostgreSQL's timestamptz range: from 4714-11-24 BC (Go's year -4713)
// up to, not including, 294277-01-01, both UTC.
var (
	minTimestamptz = time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC)
	endTimestamptz = time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC)
)

// storable checks that the text WaitTx stores is text PostgreSQL takes as
// it is (ErrMessageNotStorable otherwise): a statement refused in the
// caller's transaction would abort it, and json.Marshal would store a
// header's bytes that are not UTF-8 as U+FFFD, another message than the
// one delivered.
func storable(w Wait) error {
	check := func(what, v string) error {
		if i := strings.IndexByte(v, 0); i >= 0 {
			return fmt.Errorf("%w: %s holds a NUL byte at byte %d", ErrMessageNotStorable, what, i)
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("%w: %s is not valid UTF-8", ErrMessageNotStorable, what)
		}
		return nil
	}
	m := w.Message
	// Two fields have a range narrower than Go's: schema_version is an
	// integer, occurred_at a timestamptz (4714 BC to 294276 AD). PostgreSQL
	// refusing the time aborted tx; pgx refuses the integer itself.
	if m.SchemaVersion < math.MinInt32 || m.SchemaVersion > math.MaxInt32 {
		return fmt.Errorf("%w: Message.SchemaVersion %d is out of an integer's range", ErrMessageNotStorable, m.SchemaVersion)
	}
	if !m.OccurredAt.IsZero() && (m.OccurredAt.Before(minTimestamptz) || !m.OccurredAt.Before(endTimestamptz)) {
		return fmt.Errorf("%w: Message.OccurredAt %s is out of timestamptz's range", ErrMessageNotStorable, m.OccurredAt.UTC().Format(time.RFC3339Nano))
	}
	for _, f := range []struct{ what, v string }{{"Wait.Consumer", w.Consumer}, {"Wait.Key", w.Key},
		{"Message.Type", m.Type}, {"Message.AggregateType", m.AggregateType}, {"Message.AggregateID", m.AggregateID},
		{"Message.ContentType", m.ContentType}} {
		if err := check(f.what, f.v); err != nil {
			return err
		}
	}
	for k, v := range m.Headers {
		if err := check(fmt.Sprintf("the name of header %q", k), k); err != nil {
			return err
		}
		if err := check("header "+strconv.Quote(k), v); err != nil {
			return err
		}
	}
	return nil
}

// Resumer is what Resume runs a waiting event's handler with.
type Resumer struct {
	// Consumer is the consumer whose waits are taken up (Wait.Consumer).
	// Required.
	Consumer string
	// Handle runs a waiting event again, for a Caller built by New: tx is
	// a transaction of Resume's, holding the wait's row lock; msg is the
	// message WaitTx stored. It should do what the event's delivery does
	// (typically the same function as the inbox's effect): call Do again
	// with the same key and request, and apply the outcome through tx. When
	// it returns nil, the wait is deleted in tx and tx commits, so what the
	// handler wrote and the end of the wait commit together; when it
	// returns an error, what it wrote through tx is rolled back, the wait
	// stays (its error recorded) and is run again later. A handler that
	// finds the attempt parked again records the wait again (WaitTx in tx)
	// and returns nil, or returns the error: either way the event waits
	// for the next resolution.
	Handle func(ctx context.Context, tx pgx.Tx, msg outbox.Message) error
	// HandleSQL is Handle for a Caller built by NewSQL: tx is a
	// database/sql transaction.
	HandleSQL func(ctx context.Context, tx *sql.Tx, msg outbox.Message) error
}

// ResumeReport says what one ResumeOnce did.
type ResumeReport struct {
	// Resumed counts the waits whose handler succeeded: they ended.
	Resumed int `json:"resumed"`
	// Waiting counts the waits whose handler returned an error (run again
	// after a backoff, or at the attempt's next resolution when it was
	// parked again) or recorded the wait again.
	Waiting int `json:"waiting"`
}

// errNotDue ends a resume whose wait is not due after all.
var errNotDue = errors.New("sideeffect: the wait is not due")

// resumable is the condition on w (side_effect_waits) and s (its attempt,
// LEFT JOINed) under which a waiting event is run again: the attempt is no
// longer parked (resolved by an operator), nor held by a live claim, nor
// unknown and waiting for its next check (unless an operator let the next
// call go); or it is missing (Do then calls). And the wait is due: not in
// the backoff after its handler failed, unless the attempt changed since
// that run (an operator's resolution, a lookup's answer).
const resumable = `(w.next_wake_at <= now() OR s.updated_at > w.last_woken_at)
	AND (s.key IS NULL OR (s.state <> 'parked'
		AND NOT (s.state = 'started' AND s.lease_until > now())
		AND NOT (s.state = 'unknown' AND NOT s.operator_retry AND s.next_check_at > now())))`

// ResumeOnce runs the handler of every waiting event of r.Consumer whose
// attempt of the Caller is no longer parked (at most Config.ReconcileBatch
// of them), each in a transaction of its own that locks its wait (FOR
// UPDATE SKIP LOCKED: any number of Resume loops, in any processes, share
// the waits, and a wait's handler runs in one of them at a time) and
// deletes it when the handler succeeds. A crash before that commit leaves
// the wait as it was, to be run again. It returns an error when the
// database fails, not when a handler does (that is recorded on the wait).
func (c *Caller) ResumeOnce(ctx context.Context, r Resumer) (ResumeReport, error) {
	var rep ResumeReport
	handle, err := c.resumeHandler(r)
	if err != nil {
		return rep, err
	}
	// Each wait runs at most once a round (its handler's run sets
	// last_woken_at past the round's start): the round ends when no wait
	// is left to run, or at the batch.
	var start time.Time
	if err := c.db.QueryRow(ctx, `SELECT now()`).Scan(&start); err != nil {
		return rep, fmt.Errorf("sideeffect %s: resume the waits of consumer %s: %w", c.cfg.Name, r.Consumer, err)
	}
	for n := 0; n < c.cfg.ReconcileBatch; n++ {
		got, err := c.resumeOne(ctx, r.Consumer, start, handle)
		if err != nil {
			return rep, fmt.Errorf("sideeffect %s: resume the waits of consumer %s: %w", c.cfg.Name, r.Consumer, err)
		}
		switch got {
		case resumeNone:
			return rep, nil
		case resumeEnded:
			rep.Resumed++
		case resumeWaits:
			rep.Waiting++
		}
	}
	return rep, nil
}

func (c *Caller) resumeHandler(r Resumer) (func(ctx context.Context, tx pgtx.Querier, msg outbox.Message) error, error) {
	if err := checkName("Resumer.Consumer", r.Consumer); err != nil {
		return nil, err
	}
	switch {
	case c.sqlDB && r.HandleSQL != nil:
		return func(ctx context.Context, tx pgtx.Querier, msg outbox.Message) error {
			t, _ := pgtx.SQLOf(tx)
			return r.HandleSQL(ctx, t, msg)
		}, nil
	case !c.sqlDB && r.Handle != nil:
		return func(ctx context.Context, tx pgtx.Querier, msg outbox.Message) error {
			t, _ := pgtx.PgxOf(tx)
			return r.Handle(ctx, t, msg)
		}, nil
	case c.sqlDB:
		return nil, errors.New("sideeffect: Resume on a Caller built by NewSQL needs Resumer.HandleSQL (its transactions are database/sql ones)")
	}
	return nil, errors.New("sideeffect: Resume on a Caller built by New needs Resumer.Handle (its transactions are pgx ones)")
}

// resumed is what resumeOne did.
type resumed int

const (
	resumeNone    resumed = iota // no wait due (or every due one locked by another Resume)
	resumeEnded                  // the handler succeeded: the wait ended
	resumeWaits                  // the handler failed, or recorded the wait again
	resumeSkipped                // the wait claimed was not due once read under its lock
)

// resumeOne runs the handler of one due wait.
func (c *Caller) resumeOne(ctx context.Context, consumer string, round time.Time, handle func(ctx context.Context, tx pgtx.Querier, msg outbox.Message) error) (resumed, error) {
	got := resumeNone
	err := c.db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		var id uuid.UUID
		err := tx.QueryRow(ctx, `SELECT w.event_id FROM `+c.waits+` w
LEFT JOIN `+c.t+` s ON s.name = w.name AND s.key = w.key
WHERE w.name = $1 AND w.consumer_name = $2 AND (w.last_woken_at IS NULL OR w.last_woken_at < $3) AND `+resumable+`
ORDER BY w.next_wake_at
LIMIT 1
FOR UPDATE OF w SKIP LOCKED`, c.cfg.Name, consumer, round).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("claim a wait: %w", err)
		}
		// Read again under the lock, in a statement of its own (a fresh
		// snapshot): the wait and its attempt as committed now, not as the
		// claiming statement saw them before it waited for the lock. A
		// wait another Resume just ended is gone; one whose handler found
		// the attempt parked again is not due.
		var m outbox.Message
		var headers string
		var occurred *time.Time
		var recorded, wakes int
		var key string
		err = tx.QueryRow(ctx, `SELECT w.key, w.aggregate_type, w.aggregate_id, w.sequence, w.event_type, w.schema_version, w.content_type,
	w.payload, w.headers::text, w.occurred_at, w.skipped_from, w.recorded, w.wakes
FROM `+c.waits+` w
LEFT JOIN `+c.t+` s ON s.name = w.name AND s.key = w.key
WHERE w.consumer_name = $1 AND w.event_id = $2 AND w.name = $3 AND `+resumable, consumer, id, c.cfg.Name).Scan(
			&key, &m.AggregateType, &m.AggregateID, &m.Sequence, &m.Type, &m.SchemaVersion, &m.ContentType,
			&m.Payload, &headers, &occurred, &m.SkippedFrom, &recorded, &wakes)
		if errors.Is(err, pgx.ErrNoRows) {
			return errNotDue
		}
		if err != nil {
			return fmt.Errorf("read the wait of event %s: %w", id, err)
		}
		m.ID = id
		if occurred != nil {
			m.OccurredAt = occurred.UTC()
		}
		if headers != "{}" {
			if err := json.Unmarshal([]byte(headers), &m.Headers); err != nil {
				return fmt.Errorf("the wait of event %s: headers: %w", id, err)
			}
		}
		if _, err := tx.Exec(ctx, `SAVEPOINT sideeffect_resume`); err != nil {
			return err
		}
		herr := handle(ctx, tx, m)
		if herr == nil {
			var ended bool
			err := tx.QueryRow(ctx, `DELETE FROM `+c.waits+` WHERE consumer_name = $1 AND event_id = $2 AND recorded = $3 RETURNING true`,
				consumer, id, recorded).Scan(&ended)
			if err == nil {
				got = resumeEnded
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("end the wait of event %s: %w", id, err)
			}
			// The handler recorded the wait again: it waits on.
			got = resumeWaits
			_, err = tx.Exec(ctx, `UPDATE `+c.waits+` SET wakes = wakes + 1, last_woken_at = clock_timestamp(), last_error = NULL
WHERE consumer_name = $1 AND event_id = $2`, consumer, id)
			return err
		}
		if ctx.Err() != nil {
			return herr // stopped: the transaction rolls back, the wait is as it was
		}
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT sideeffect_resume`); err != nil {
			return errors.Join(herr, err)
		}
		// Parked again: the next resolution makes it due. Otherwise run it
		// again after a backoff (the attempt's own schedule still applies).
		next := time.Duration(0)
		if !errors.Is(herr, ErrParked) {
			next = c.backoff(wakes)
		}
		// Any text the handler's error holds (a NUL, bytes not UTF-8) is
		// stored as PostgreSQL's text takes it, cut on a character: a text
		// refused there failed the round at this wait, every round.
		msg := pgtext.Clean(herr.Error(), 2000)
		// last_woken_at is taken after the handler: a change of the
		// attempt by the handler's own Do does not count as a new one.
		if _, err := tx.Exec(ctx, `UPDATE `+c.waits+` SET wakes = wakes + 1, last_woken_at = clock_timestamp(), last_error = $3,
	next_wake_at = now() + make_interval(secs => $4)
WHERE consumer_name = $1 AND event_id = $2`, consumer, id, msg, secs(next)); err != nil {
			return errors.Join(herr, err)
		}
		got = resumeWaits
		if !expected(herr) {
			c.cfg.Logger.Warn("a waiting event's handler failed; it runs again later",
				slog.String("name", c.cfg.Name), slog.String("key", key), slog.String("consumer", consumer),
				slog.String("event_id", id.String()), slog.Any("error", herr))
		}
		return nil
	})
	switch {
	case errors.Is(err, errNotDue):
		return resumeSkipped, nil
	case err != nil:
		return resumeNone, err
	}
	return got, nil
}

// expected says whether a handler's error is one of Do's answers that
// only mean "not yet": recorded on the wait, not logged.
func expected(err error) bool {
	for _, e := range []error{ErrParked, ErrUnknown, ErrInProgress, ErrLeaseExpired, ErrLeaseLost} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Resume runs ResumeOnce until ctx ends, and returns nil then: at once,
// whenever an attempt of the Caller's name leaves the parked state, or
// becomes succeeded or failed after its outcome was unknown (a
// notification on the channel ResolvedChannel, sent by a trigger of the
// side_effects table, so an operator's resolution by Admin.Resolve, `outbox
// sideeffect resolve`, the console or an UPDATE by hand, and a lookup's
// answer, wake it alike),
// every Config.ResumePoll otherwise, and again at once after a full batch.
// A failed round is logged and tried again at the next poll. Run one per
// consumer and Caller whose ErrParked the consumer waits on (WaitTx), in
// one process or several: they share the waits.
//
// It holds one connection to listen, and, while a handler runs, the
// handler's transaction and whatever the handler takes (Do records with
// another). Over database/sql, it listens when the driver is pgx's stdlib;
// with another driver it polls only.
func (c *Caller) Resume(ctx context.Context, r Resumer) error {
	if _, err := c.resumeHandler(r); err != nil {
		return err
	}
	wake := make(chan struct{}, 1)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.listen(lctx, wake)
	}()
	defer func() { stop(); <-done }()
	for {
		rep, err := c.ResumeOnce(ctx, r)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			c.cfg.Logger.Warn("resume events waiting on side effects", slog.String("name", c.cfg.Name),
				slog.String("consumer", r.Consumer), slog.Any("error", err))
		}
		if err == nil && rep.Resumed+rep.Waiting == c.cfg.ReconcileBatch {
			continue
		}
		t := time.NewTimer(c.cfg.ResumePoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-wake:
			t.Stop()
		}
	}
}

// ResolvedChannel is the LISTEN/NOTIFY channel on which the side_effects
// table's trigger (migration 16) announces an attempt that left the parked
// state or was settled after its outcome was unknown, in every schema: the
// payload is a JSON object {"schema", "name"}.
const ResolvedChannel = "outbox_sideeffect_resolved"

// errNoListen: the database/sql driver is not pgx's.
var errNoListen = errors.New("the database/sql driver offers no LISTEN (not pgx's stdlib)")

// listen turns the notifications of resolutions of the Caller's name in
// its schema into wake-ups, on a connection of its own, until ctx ends.
// On an error it reconnects after a pause; Resume polls meanwhile.
func (c *Caller) listen(ctx context.Context, wake chan<- struct{}) {
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	failures := 0
	for ctx.Err() == nil {
		err := c.withPgxConn(ctx, func(conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, "LISTEN "+ResolvedChannel); err != nil {
				return err
			}
			defer func() {
				if !conn.IsClosed() {
					_, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN "+ResolvedChannel)
				}
			}()
			failures = 0
			poke() // a resolution committed before LISTEN took effect
			for {
				n, err := conn.WaitForNotification(ctx)
				if err != nil {
					return err
				}
				var p struct{ Schema, Name string }
				if json.Unmarshal([]byte(n.Payload), &p) == nil && p.Schema == c.schema && p.Name == c.cfg.Name {
					poke()
				}
			}
		})
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoListen) {
			c.cfg.Logger.Info("resume polls only: "+err.Error(), slog.String("name", c.cfg.Name))
			return
		}
		failures++
		c.cfg.Logger.Warn("listen for resolved side effects failed; polling meanwhile", slog.String("name", c.cfg.Name), slog.Any("error", err))
		t := time.NewTimer(c.backoff(failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// withPgxConn runs fn on a pgx connection of the Caller's database, held
// for fn's duration: one of the pool's, or the one under a database/sql
// connection when the driver is pgx's stdlib.
func (c *Caller) withPgxConn(ctx context.Context, fn func(*pgx.Conn) error) error {
	switch db := c.db.(type) {
	case pgtx.PgxPool:
		conn, err := db.Pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		return fn(conn.Conn())
	case pgtx.SQLDB:
		conn, err := db.DB.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		return conn.Raw(func(dc any) error {
			p, ok := dc.(interface{ Conn() *pgx.Conn })
			if !ok {
				return errNoListen
			}
			return fn(p.Conn())
		})
	}
	return errNoListen
}
