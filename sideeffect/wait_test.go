package sideeffect_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgtx"
	"github.com/pgoutbox/outbox/sideeffect"
)

// waitWorld is a consumer that charges per event through a Caller in mode
// Neither, inside its inbox's transaction, and waits on a parked charge
// with WaitTx; Resume runs its handler again once the charge is resolved.
// The effect is a row in effects, written with the charge's outcome.
type waitWorld struct {
	b        *bundle
	c        *sideeffect.Caller
	in       *inbox.Inbox
	consumer string
	call     sideeffect.Call
	req      []byte
	// calls counts the handler's runs (deliveries and resumes alike).
	calls atomic.Int64
	// after runs once the handler wrote its effect, before it returns:
	// a fault there is a crash after the effect, before the wait's end.
	after atomic.Pointer[func(ctx context.Context) error]
	// entered, when set, is signalled by a handler run and the run then
	// waits for release.
	entered, release chan struct{}
}

func newWaitWorld(t *testing.T, k txKind, edit func(*sideeffect.Config)) *waitWorld {
	t.Helper()
	b := setupKind(t, sideeffect.Neither, k)
	w := &waitWorld{b: b, consumer: "billing"}
	w.call, w.req = b.p.call(2500)
	w.c = b.caller(t, edit)
	var err error
	if k.sql {
		db := stdlib.OpenDBFromPool(b.pool)
		t.Cleanup(func() { _ = db.Close() })
		w.in, err = inbox.NewSQL(db, inbox.Config{Consumer: w.consumer, Tables: outbox.Schema(b.schema)})
	} else {
		w.in, err = inbox.New(b.pool, inbox.Config{Consumer: w.consumer, Tables: outbox.Schema(b.schema)})
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(context.Background(), `CREATE TABLE `+b.schema+`.effects (
	event_id uuid PRIMARY KEY, state text NOT NULL, via text NOT NULL, payload bytea NOT NULL, headers text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return w
}

// handle is the consumer's handling of msg, over either kind of
// transaction: the charge, and its outcome recorded; a parked charge makes
// the event wait.
func (w *waitWorld) handle(ctx context.Context, tx pgtx.Querier, msg outbox.Message, wait func(sideeffect.Wait) error) error {
	w.calls.Add(1)
	if w.entered != nil {
		w.entered <- struct{}{}
		<-w.release
	}
	key := msg.ID.String()
	res, err := w.c.Do(ctx, key, w.req, w.call)
	if errors.Is(err, sideeffect.ErrParked) {
		return wait(sideeffect.Wait{Consumer: w.consumer, Key: key, Message: msg})
	}
	if err != nil {
		return err
	}
	h, _ := json.Marshal(msg.Headers)
	if _, err := tx.Exec(ctx, `INSERT INTO `+w.b.schema+`.effects (event_id, state, via, payload, headers) VALUES ($1, $2, $3, $4, $5)`,
		msg.ID, string(res.State), res.Via, msg.Payload, string(h)); err != nil {
		return err
	}
	if f := w.after.Load(); f != nil {
		return (*f)(ctx)
	}
	return nil
}

// deliver hands msg to the inbox, as the broker's delivery would.
func (w *waitWorld) deliver(ctx context.Context, msg outbox.Message) (inbox.Outcome, error) {
	if w.b.kind.sql {
		return w.in.HandleSQL(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
			return w.handle(ctx, pgtx.SQL(tx), msg, func(x sideeffect.Wait) error { return w.c.WaitSQLTx(ctx, tx, x) })
		})
	}
	return w.in.Handle(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		return w.handle(ctx, pgtx.Pgx(tx), msg, func(x sideeffect.Wait) error { return w.c.WaitTx(ctx, tx, x) })
	})
}

// resumer is the Resumer of the world's kind, running handle.
func (w *waitWorld) resumer() sideeffect.Resumer {
	return sideeffect.Resumer{Consumer: w.consumer,
		Handle: func(ctx context.Context, tx pgx.Tx, msg outbox.Message) error {
			return w.handle(ctx, pgtx.Pgx(tx), msg, func(x sideeffect.Wait) error { return w.c.WaitTx(ctx, tx, x) })
		},
		HandleSQL: func(ctx context.Context, tx *sql.Tx, msg outbox.Message) error {
			return w.handle(ctx, pgtx.SQL(tx), msg, func(x sideeffect.Wait) error { return w.c.WaitSQLTx(ctx, tx, x) })
		},
	}
}

func (w *waitWorld) message() outbox.Message {
	return outbox.Message{ID: uuid.New(), AggregateType: "order", AggregateID: uuid.NewString(), Sequence: 1, Type: "StockReserved",
		SchemaVersion: 2, ContentType: "application/json", Payload: []byte(`{"total": 2500, "note": "exact \u00e9 bytes"}`),
		Headers:    map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		OccurredAt: time.Date(2026, 12, 7, 1, 2, 3, 456000000, time.UTC)}
}

// park delivers msg twice: the charge's answer is lost (unknown, not
// acknowledged), then mode Neither parks it and the event waits, applied
// and acknowledged.
func (w *waitWorld) park(t *testing.T, msg outbox.Message, f fault) {
	t.Helper()
	ctx := context.Background()
	w.b.p.inject(f)
	if _, err := w.deliver(ctx, msg); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("first delivery: %v, want ErrUnknown (not acknowledged)", err)
	}
	if out, err := w.deliver(ctx, msg); err != nil || out != inbox.Applied {
		t.Fatalf("second delivery: %v, %v; want applied (the event waits on the parked charge)", out, err)
	}
	if a := w.b.attempt(t, msg.ID.String()); a.State != sideeffect.Parked {
		t.Fatalf("the charge: %+v, want parked", a)
	}
	if n := w.waits(t); n != 1 {
		t.Fatalf("%d waits recorded, want 1", n)
	}
}

func (w *waitWorld) waits(t *testing.T) int {
	t.Helper()
	var n int
	if err := w.b.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+w.b.schema+`.side_effect_waits`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// effect returns the effect's state and via, "" when none was written.
func (w *waitWorld) effect(t *testing.T, id uuid.UUID) (state, via string) {
	t.Helper()
	err := w.b.pool.QueryRow(context.Background(), `SELECT state, via FROM `+w.b.schema+`.effects WHERE event_id = $1`, id).Scan(&state, &via)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return state, via
}

func (w *waitWorld) resolve(t *testing.T, key string, as sideeffect.ResolveAs, response []byte) {
	t.Helper()
	if _, err := w.b.admin.Resolve(context.Background(), sideeffect.Resolution{Name: w.c.Name(), Key: key, As: as, Response: response,
		By: "alice", Reason: "checked with the provider"}); err != nil {
		t.Fatal(err)
	}
}

// runResume runs Resume until the test ends.
func (w *waitWorld) runResume(t *testing.T, c *sideeffect.Caller) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Resume(ctx, w.resumer()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Resume: %v", err)
		}
	})
}

// Issue 22, item 6: a parked charge's event waits, acknowledged, instead of
// being redelivered; an operator's resolution (Admin.Resolve) wakes it at
// once (Resume polls once an hour here: the trigger's notification wakes
// it), and the handler runs once with the stored message, the effect and
// the wait's end committing together. Two Resume loops race for it.
func TestParkedWaitResumesOnceOnResolve(t *testing.T) {
	t.Parallel()
	forKinds(t, testParkedWaitResumesOnceOnResolve)
}

func testParkedWaitResumesOnceOnResolve(t *testing.T, k txKind) {
	w := newWaitWorld(t, k, func(cfg *sideeffect.Config) { cfg.ResumePoll = time.Hour })
	ctx := context.Background()
	msg := w.message()
	w.park(t, msg, faultDropAfterCommit)
	if n := w.b.p.charges(msg.ID.String()); n != 1 {
		t.Fatalf("the provider charged %d times, want 1 (before the lost answer)", n)
	}

	// No redelivery loop: the event was acknowledged; a lost ack's
	// redelivery is a duplicate that runs nothing, and Resume leaves a
	// parked attempt's event alone.
	calls := w.calls.Load()
	for range 20 {
		if out, err := w.deliver(ctx, msg); err != nil || out != inbox.Duplicate {
			t.Fatalf("redelivery of the waiting event: %v, %v; want duplicate", out, err)
		}
	}
	if rep, err := w.c.ResumeOnce(ctx, w.resumer()); err != nil || rep != (sideeffect.ResumeReport{}) {
		t.Fatalf("ResumeOnce while parked: %+v, %v; want nothing", rep, err)
	}
	if n := w.calls.Load(); n != calls {
		t.Fatalf("the handler ran %d times while the charge was parked", n-calls)
	}
	posts, _ := w.b.p.counts()

	// Two Resume loops, each its own Caller, as two processes.
	other := w.b.caller(t, func(cfg *sideeffect.Config) { cfg.ResumePoll = time.Hour })
	w.runResume(t, w.c)
	w.runResume(t, other)
	response, _ := json.Marshal(map[string]any{"id": 1, "status": "captured"})
	w.resolve(t, msg.ID.String(), sideeffect.ResolveSucceeded, response)
	outboxtest.Eventually(t, 30*time.Second, "the waiting event resumed", func() bool {
		s, _ := w.effect(t, msg.ID)
		return s != "" && w.waits(t) == 0
	})
	if s, via := w.effect(t, msg.ID); s != "succeeded" || via != "operator" {
		t.Fatalf("effect %s via %s, want succeeded via operator", s, via)
	}
	// Both loops are idle now: a round finds nothing; the handler ran once.
	for _, c := range []*sideeffect.Caller{w.c, other} {
		if rep, err := c.ResumeOnce(ctx, w.resumer()); err != nil || rep != (sideeffect.ResumeReport{}) {
			t.Fatalf("ResumeOnce after the resume: %+v, %v", rep, err)
		}
	}
	if n := w.calls.Load() - calls; n != 1 {
		t.Fatalf("the handler ran %d times after the resolution, want 1", n)
	}
	if p, _ := w.b.p.counts(); p != posts {
		t.Fatalf("the provider got %d more charges, want none (resolved as succeeded)", p-posts)
	}
	// The stored message came back as delivered.
	var payload []byte
	var headers string
	if err := w.b.pool.QueryRow(ctx, `SELECT payload, headers FROM `+w.b.schema+`.effects WHERE event_id = $1`, msg.ID).Scan(&payload, &headers); err != nil {
		t.Fatal(err)
	}
	if string(payload) != string(msg.Payload) || headers != `{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}` {
		t.Fatalf("the handler got payload %q, headers %s", payload, headers)
	}
}

// The wait's row lock fences its handler: while one Resume runs it,
// another finds nothing to do; and the message handed back is the one
// stored, field by field.
func TestResumeRunsAWaitInOneLoopAtATime(t *testing.T) {
	w := newWaitWorld(t, txKinds[0], nil)
	ctx := context.Background()
	msg := w.message()
	msg.SkippedFrom = 1
	w.park(t, msg, faultDropAfterCommit)
	w.resolve(t, msg.ID.String(), sideeffect.ResolveFailed, nil)

	var got outbox.Message
	w.entered, w.release = make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	r := w.resumer()
	inner := r.Handle
	r.Handle = func(ctx context.Context, tx pgx.Tx, m outbox.Message) error {
		got = m
		return inner(ctx, tx, m)
	}
	go func() {
		rep, err := w.c.ResumeOnce(ctx, r)
		if err == nil && rep.Resumed != 1 {
			err = errors.New("the first ResumeOnce resumed nothing")
		}
		first <- err
	}()
	<-w.entered
	// The first holds the wait: a second Caller's round skips it.
	other := w.b.caller(t, nil)
	if rep, err := other.ResumeOnce(ctx, w.resumer()); err != nil || rep != (sideeffect.ResumeReport{}) {
		t.Fatalf("a second ResumeOnce while the first runs the wait: %+v, %v; want nothing", rep, err)
	}
	close(w.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	w.entered = nil
	if rep, err := other.ResumeOnce(ctx, w.resumer()); err != nil || rep != (sideeffect.ResumeReport{}) {
		t.Fatalf("ResumeOnce after the first ended the wait: %+v, %v", rep, err)
	}
	if s, via := w.effect(t, msg.ID); s != "failed" || via != "operator" {
		t.Fatalf("effect %s via %s, want failed via operator", s, via)
	}
	got.Attempt, msg.Attempt = 0, 0
	if got.ID != msg.ID || got.AggregateType != msg.AggregateType || got.AggregateID != msg.AggregateID || got.Sequence != msg.Sequence ||
		got.Type != msg.Type || got.SchemaVersion != msg.SchemaVersion || got.ContentType != msg.ContentType ||
		string(got.Payload) != string(msg.Payload) || len(got.Headers) != 1 || got.Headers["traceparent"] != msg.Headers["traceparent"] ||
		!got.OccurredAt.Equal(msg.OccurredAt) || got.SkippedFrom != msg.SkippedFrom {
		t.Fatalf("the handler got\n%+v\nwant\n%+v", got, msg)
	}
}

// Resolved as "retry": the handler's Do calls once. A handler that fails
// after its effect (an error, or its process stopped: ctx canceled) rolls
// the effect back with the wait left as it was, and the next run finds the
// call's recorded outcome: one charge, one effect. A retry whose call is
// ambiguous again parks again, and the handler's WaitTx keeps the event
// waiting for the next resolution.
func TestResumeAfterRetrySurvivesAFailedHandler(t *testing.T) {
	t.Parallel()
	forKinds(t, testResumeAfterRetrySurvivesAFailedHandler)
}

func testResumeAfterRetrySurvivesAFailedHandler(t *testing.T, k txKind) {
	w := newWaitWorld(t, k, func(cfg *sideeffect.Config) {
		// A failed handler runs again after this backoff.
		cfg.CheckInterval, cfg.MaxCheckInterval = time.Millisecond, time.Millisecond
	})
	ctx := context.Background()
	msg := w.message()
	key := msg.ID.String()
	w.park(t, msg, faultDropBeforeCommit)
	if n := w.b.p.charges(key); n != 0 {
		t.Fatalf("the provider charged %d times, want 0 (the request was lost)", n)
	}

	// The retry's call is lost again: parked again, and the handler
	// records the wait again.
	w.resolve(t, key, sideeffect.ResolveRetry, nil)
	w.b.p.inject(faultDropBeforeCommit)
	rep, err := w.c.ResumeOnce(ctx, w.resumer())
	if err != nil || rep.Resumed != 0 || rep.Waiting < 1 {
		t.Fatalf("ResumeOnce, the retry lost: %+v, %v; want the event waiting", rep, err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the retry's lost call parked again", func() bool {
		_, _ = w.c.ResumeOnce(ctx, w.resumer())
		return w.b.attempt(t, key).State == sideeffect.Parked
	})
	if w.waits(t) != 1 {
		t.Fatal("the event stopped waiting on the attempt parked again")
	}
	if rep, err := w.c.ResumeOnce(ctx, w.resumer()); err != nil || rep != (sideeffect.ResumeReport{}) {
		t.Fatalf("ResumeOnce, parked again: %+v, %v; want nothing", rep, err)
	}

	// Retry again: the call charges, then the handler fails after its
	// effect: first by an error, then by its ctx ending (its process
	// stopping). Nothing of the effect commits; the wait stays.
	w.resolve(t, key, sideeffect.ResolveRetry, nil)
	failing := func(ctx context.Context) error { return errors.New("crash after the effect") }
	w.after.Store(&failing)
	rep, err = w.c.ResumeOnce(ctx, w.resumer())
	if err != nil || rep.Resumed != 0 || rep.Waiting < 1 {
		t.Fatalf("ResumeOnce with a failing handler: %+v, %v", rep, err)
	}
	if s, _ := w.effect(t, msg.ID); s != "" || w.waits(t) != 1 {
		t.Fatalf("a failed handler's effect committed (%q) or its wait ended", s)
	}
	var lastError string
	if err := w.b.pool.QueryRow(ctx, `SELECT coalesce(last_error, '') FROM `+w.b.schema+`.side_effect_waits`).Scan(&lastError); err != nil ||
		lastError != "crash after the effect" {
		t.Fatalf("the wait's last error %q, %v", lastError, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	stop := func(context.Context) error { cancel(); return cctx.Err() }
	w.after.Store(&stop)
	outboxtest.Eventually(t, 30*time.Second, "a resume stopped by its ctx", func() bool {
		_, err := w.c.ResumeOnce(cctx, w.resumer())
		return cctx.Err() != nil && err != nil
	})
	if s, _ := w.effect(t, msg.ID); s != "" || w.waits(t) != 1 {
		t.Fatalf("a stopped handler's effect committed (%q) or its wait ended", s)
	}

	w.after.Store(nil)
	outboxtest.Eventually(t, 30*time.Second, "the waiting event resumed", func() bool {
		_, err := w.c.ResumeOnce(ctx, w.resumer())
		if err != nil {
			t.Fatal(err)
		}
		return w.waits(t) == 0
	})
	if s, via := w.effect(t, msg.ID); s != "succeeded" || via != "call" {
		t.Fatalf("effect %s via %s, want succeeded via call", s, via)
	}
	if n := w.b.p.charges(key); n != 1 {
		t.Fatalf("the provider charged %d times, want 1", n)
	}
	if a := w.b.attempt(t, key); a.Attempts > 3 {
		t.Fatalf("the attempt %+v: more calls than the two lost and the one that charged", a)
	}
}

// A resolution by hand (an UPDATE of side_effects, as an operator with psql
// would) wakes Resume too: the trigger, not Admin.Resolve, sends the
// notification; over database/sql, Resume listens on the pgx stdlib
// driver's connection. And Resume checks its Resumer.
func TestResumeWakesOnAResolutionBySQL(t *testing.T) {
	t.Parallel()
	forKinds(t, testResumeWakesOnAResolutionBySQL)
}

func testResumeWakesOnAResolutionBySQL(t *testing.T, k txKind) {
	w := newWaitWorld(t, k, func(cfg *sideeffect.Config) {
		cfg.ResumePoll = time.Hour
		cfg.Logger = slog.New(slog.DiscardHandler)
	})
	ctx := context.Background()
	wrong := sideeffect.Resumer{Consumer: w.consumer, HandleSQL: w.resumer().HandleSQL}
	if k.sql {
		wrong = sideeffect.Resumer{Consumer: w.consumer, Handle: w.resumer().Handle}
	}
	if err := w.c.Resume(ctx, wrong); err == nil {
		t.Fatal("Resume with the other kind's handler only: no error")
	}
	if err := w.c.Resume(ctx, sideeffect.Resumer{Handle: w.resumer().Handle, HandleSQL: w.resumer().HandleSQL}); err == nil {
		t.Fatal("Resume without a consumer: no error")
	}
	msg := w.message()
	w.park(t, msg, faultDropAfterCommit)
	// Resume on a pool of its own, named, so that the test sees when it
	// listens: a resolution committed after that is notified. (One
	// committed before is found by the round Resume runs once it
	// listens, which would hide a trigger that notifies nothing.)
	app := outboxtest.UniqueName(t, "resume")
	pcfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg := sideeffect.Config{Name: w.c.Name(), Tables: outbox.Schema(w.b.schema), Mode: sideeffect.Neither, ResumePoll: time.Hour}
	var c *sideeffect.Caller
	if k.sql {
		// database/sql over pgx's stdlib: Resume listens on the driver's
		// connection.
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { _ = db.Close() })
		c, err = sideeffect.NewSQL(db, cfg)
	} else {
		c, err = sideeffect.New(pool, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	w.runResume(t, c)
	outboxtest.Eventually(t, 30*time.Second, "Resume listening", func() bool {
		var n int
		err := w.b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND state = 'idle' AND query = 'LISTEN `+sideeffect.ResolvedChannel+`'`, app).Scan(&n)
		return err == nil && n == 1
	})
	if _, err := w.b.pool.Exec(ctx, `UPDATE `+w.b.schema+`.side_effects SET state = 'succeeded', resolved_via = 'operator',
	operator_at = now(), operator_by = 'psql', operator_reason = 'by hand' WHERE name = $1 AND key = $2`, w.c.Name(), msg.ID.String()); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "the waiting event resumed after a resolution by SQL", func() bool {
		return w.waits(t) == 0
	})
	if s, _ := w.effect(t, msg.ID); s != "succeeded" {
		t.Fatalf("effect %q, want succeeded", s)
	}
}

// The trigger notifies an attempt's resolution, and an unknown outcome
// settled later, and never a call answered at once (the common path, whose
// commits must not queue on the notification lock).
func TestResolvedNotificationsOnlyForResolutions(t *testing.T) {
	b := setup(t, sideeffect.Neither)
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+sideeffect.ResolvedChannel); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN "+sideeffect.ResolvedChannel) }()

	parking := b.caller(t, nil) // payments.charge, mode neither
	mail, err := sideeffect.New(b.pool, sideeffect.Config{Name: "mail.send", Tables: outbox.Schema(b.schema), Mode: sideeffect.Idempotent})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context, string) ([]byte, error) { return []byte(`{"id":"m"}`), nil }
	lost := func(context.Context, string) ([]byte, error) { return nil, errors.New("connection reset by peer") }
	// Answered at once, many times: nothing.
	for range 5 {
		if _, err := mail.Do(ctx, uuid.NewString(), nil, ok); err != nil {
			t.Fatal(err)
		}
	}
	// A parked charge, resolved: payments.charge.
	key := uuid.NewString()
	if _, err := parking.Do(ctx, key, nil, lost); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	if _, err := parking.Do(ctx, key, nil, ok); !errors.Is(err, sideeffect.ErrParked) {
		t.Fatal(err)
	}
	if _, err := b.admin.Resolve(ctx, sideeffect.Resolution{Name: parking.Name(), Key: key, As: sideeffect.ResolveFailed, By: "alice", Reason: "x"}); err != nil {
		t.Fatal(err)
	}
	// An unknown mail, settled by the next Do: mail.send.
	mkey := uuid.NewString()
	if _, err := mail.Do(ctx, mkey, nil, lost); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	if _, err := mail.Do(ctx, mkey, nil, ok); err != nil {
		t.Fatal(err)
	}

	var got []string
	for len(got) < 2 {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("notifications so far %v: %v", got, err)
		}
		var p struct{ Schema, Name string }
		if err := json.Unmarshal([]byte(n.Payload), &p); err != nil {
			t.Fatalf("payload %q: %v", n.Payload, err)
		}
		if p.Schema == b.schema { // other tests' schemas notify on the same channel
			got = append(got, p.Name)
		}
	}
	if got[0] != "payments.charge" || got[1] != "mail.send" {
		t.Fatalf("notifications %v, want [payments.charge mail.send]: one per resolution, none for a call answered at once", got)
	}
}
