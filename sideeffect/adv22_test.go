package sideeffect_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/sideeffect"
)

// hostileErrors are error texts PostgreSQL's text type refuses as they
// are (a NUL; bytes that are not UTF-8, as a provider's Latin-1 body
// echoed in an error), or that a cut at 2,000 bytes leaves as such (a
// multi-byte character across the cut).
var hostileErrors = map[string]string{
	"nul":         "provider said: \x00 then more",
	"latin1":      "provider said: caf\xe9",
	"cut-in-rune": strings.Repeat("a", 1999) + "é and the rest",
}

// TestAdv22AHandlersErrorOfAnyTextIsRecordedOnTheWait: a resumed handler's
// error is recorded on its wait (last_error). An error text PostgreSQL
// refuses made the recording fail: ResumeOnce returned an error at that
// wait, so the waits after it in the round (this one comes first, by
// next_wake_at) were never run, at every round, for ever, and the failing
// one was run again at every poll without its backoff.
func TestAdv22AHandlersErrorOfAnyTextIsRecordedOnTheWait(t *testing.T) {
	t.Parallel()
	for name, text := range hostileErrors {
		t.Run(name, func(t *testing.T) {
			forKinds(t, func(t *testing.T, k txKind) {
				b := setupKind(t, sideeffect.Neither, k)
				ctx := context.Background()
				c := b.caller(t, nil)
				bad, good := uuid.New(), uuid.New()
				// Two waits on attempts that do not exist (so due at once),
				// the bad one first.
				for _, id := range []uuid.UUID{bad, good} {
					err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
						return c.WaitTx(ctx, tx, sideeffect.Wait{Consumer: "billing", Key: id.String(),
							Message: outbox.Message{ID: id, AggregateType: "order", AggregateID: id.String(), Sequence: 1, Type: "T"}})
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				if _, err := b.pool.Exec(ctx, `UPDATE `+b.schema+`.side_effect_waits SET next_wake_at = now() - interval '1 hour' WHERE event_id = $1`, bad); err != nil {
					t.Fatal(err)
				}
				run := func(msg outbox.Message) error {
					if msg.ID == bad {
						return errors.New(text)
					}
					return nil
				}
				r := sideeffect.Resumer{Consumer: "billing",
					Handle:    func(ctx context.Context, tx pgx.Tx, msg outbox.Message) error { return run(msg) },
					HandleSQL: func(ctx context.Context, tx *sql.Tx, msg outbox.Message) error { return run(msg) }}
				rep, err := c.ResumeOnce(ctx, r)
				if err != nil {
					t.Fatalf("ResumeOnce: %v (the handler's error could not be recorded)", err)
				}
				if rep.Resumed != 1 || rep.Waiting != 1 {
					t.Fatalf("ResumeOnce: %+v, want the good wait resumed and the bad one waiting", rep)
				}
				var lastErr string
				if err := b.pool.QueryRow(ctx, `SELECT last_error FROM `+b.schema+`.side_effect_waits WHERE event_id = $1`, bad).Scan(&lastErr); err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(lastErr, "provider said") && !strings.HasPrefix(lastErr, "aaa") {
					t.Fatalf("last_error %q", lastErr)
				}
			})
		})
	}
}

// TestAdv22ACallErrorOfAnyTextIsRecorded: a call's error is recorded on
// the attempt (last_error). A provider's refusal whose text PostgreSQL
// refuses (Rejected: a definite failure, its response recorded) could not
// be recorded: Do returned an error and the attempt stayed started under
// its lease, to be taken as an outcome unknown once the lease ended.
func TestAdv22ACallErrorOfAnyTextIsRecorded(t *testing.T) {
	t.Parallel()
	for name, text := range hostileErrors {
		t.Run(name, func(t *testing.T) {
			forKinds(t, func(t *testing.T, k txKind) {
				b := setupKind(t, sideeffect.Neither, k)
				ctx := context.Background()
				c := b.caller(t, nil)
				key := uuid.NewString()
				res, err := c.Do(ctx, key, []byte(`{}`), func(ctx context.Context, key string) ([]byte, error) {
					return []byte("no"), sideeffect.Rejected(errors.New(text))
				})
				if err != nil || res.State != sideeffect.Failed {
					t.Fatalf("Do, refused: %s, %v; want failed, recorded", res.State, err)
				}
				if a := b.attempt(t, key); a.State != sideeffect.Failed {
					t.Fatalf("the refused attempt is %s, want failed", a.State)
				}
				// An ambiguous failure of the same text: recorded as
				// unknown (or parked, mode Neither), not left started.
				key = uuid.NewString()
				res, err = c.Do(ctx, key, []byte(`{}`), func(ctx context.Context, key string) ([]byte, error) {
					return nil, errors.New(text)
				})
				if a := b.attempt(t, key); a.State == sideeffect.Started {
					t.Fatalf("the ambiguous attempt is left started (Do: %s, %v)", res.State, err)
				}
			})
		})
	}
}

// TestAdv22AResumedHandlerThatPanicsReleasesItsWait: a handler that
// panics under Resume, the panic recovered by the application, leaves the
// wait as it was and unlocked: the next round runs it (over database/sql
// the transaction stayed open, its FOR UPDATE lock on the wait with it,
// and every later round skipped the wait as locked by another Resume).
func TestAdv22AResumedHandlerThatPanicsReleasesItsWait(t *testing.T) {
	t.Parallel()
	forKinds(t, func(t *testing.T, k txKind) {
		b := setupKind(t, sideeffect.Neither, k)
		// Cancelled at the end, before the database/sql database closes
		// (which would wait for a leaked transaction).
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		c := b.caller(t, nil)
		id := uuid.New()
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			return c.WaitTx(ctx, tx, sideeffect.Wait{Consumer: "billing", Key: id.String(),
				Message: outbox.Message{ID: id, AggregateType: "order", AggregateID: "a", Sequence: 1, Type: "T"}})
		})
		if err != nil {
			t.Fatal(err)
		}
		panicking := true
		run := func() error {
			if panicking {
				panic("handler bug")
			}
			return nil
		}
		r := sideeffect.Resumer{Consumer: "billing",
			Handle:    func(ctx context.Context, tx pgx.Tx, msg outbox.Message) error { return run() },
			HandleSQL: func(ctx context.Context, tx *sql.Tx, msg outbox.Message) error { return run() }}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the handler's panic did not pass through")
				}
			}()
			_, _ = c.ResumeOnce(ctx, r)
		}()
		panicking = false
		rep, err := c.ResumeOnce(ctx, r)
		if err != nil || rep.Resumed != 1 {
			t.Fatalf("ResumeOnce after the recovered panic: %+v, %v; want the wait resumed", rep, err)
		}
	})
}
