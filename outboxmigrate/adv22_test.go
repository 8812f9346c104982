package outboxmigrate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/sideeffect"
)

// TestAdv22GrantsCoverSideEffects: the printed grants' consumer role runs
// a consumer (its inbox, and the side effects it calls: package
// sideeffect, whose tables the consumer install creates beside the
// inbox's), and the operator role runs `outbox sideeffect show` and
// resolve, the console's side-effect page. The consumer role had no right
// on side_effects nor side_effect_waits (Do, WaitTx, Resume all refused),
// and the operator none on side_effect_waits (sideeffect.Admin.Waiting,
// which `outbox sideeffect show` calls, refused).
func TestAdv22GrantsCoverSideEffects(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool, schema := outboxtest.Schema(t)
	roles := outboxmigrate.Roles{
		Writer:   outboxtest.UniqueName(t, "w"),
		Relay:    outboxtest.UniqueName(t, "r"),
		Operator: outboxtest.UniqueName(t, "o"),
		Consumer: outboxtest.UniqueName(t, "c"),
	}
	for _, r := range []string{roles.Writer, roles.Relay, roles.Operator, roles.Consumer} {
		if _, err := pool.Exec(ctx, "CREATE ROLE "+r+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			if _, err := pool.Exec(ctx, "DROP OWNED BY "+r); err != nil {
				t.Errorf("drop owned by %s: %v", r, err)
			}
			if _, err := pool.Exec(ctx, "DROP ROLE "+r); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		})
	}
	script, err := outboxmigrate.Grants(schema, roles)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("apply grants: %v\n%s", err, script)
	}
	as := func(role string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.User = role
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	operatorDB, consumerDB := as(roles.Operator), as(roles.Consumer)

	// Consumer: a charge that succeeds, one whose outcome is unknown
	// (parked, mode Neither), an event waiting on it.
	c, err := sideeffect.New(consumerDB, sideeffect.Config{Name: "payments.charge", Tables: outbox.Schema(schema), Mode: sideeffect.Neither,
		CallTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(ctx context.Context, key string) ([]byte, error) { return []byte("ok"), nil }
	if _, err := c.Do(ctx, "k1", []byte("r"), ok); err != nil {
		t.Fatalf("consumer Do: %v", err)
	}
	_, err = c.Do(ctx, "k2", []byte("r"), func(ctx context.Context, key string) ([]byte, error) { return nil, errors.New("timeout") })
	if !errors.Is(err, sideeffect.ErrParked) && !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("consumer Do, ambiguous: %v, want parked or unknown", err)
	}
	id := uuid.New()
	err = pgx.BeginFunc(ctx, consumerDB, func(tx pgx.Tx) error {
		return c.WaitTx(ctx, tx, sideeffect.Wait{Consumer: "billing", Key: "k2",
			Message: outbox.Message{ID: id, AggregateType: "order", AggregateID: "a", Sequence: 1, Type: "Placed"}})
	})
	if err != nil {
		t.Fatalf("consumer WaitTx: %v", err)
	}
	r := sideeffect.Resumer{Consumer: "billing", Handle: func(ctx context.Context, tx pgx.Tx, msg outbox.Message) error {
		_, err := c.Do(ctx, "k2", []byte("r"), ok)
		return err
	}}
	if _, err := c.ResumeOnce(ctx, r); err != nil {
		t.Fatalf("consumer ResumeOnce: %v", err)
	}

	// Operator: what `outbox sideeffect show` and resolve do.
	a, err := sideeffect.NewAdmin(operatorDB, sideeffect.AdminConfig{Tables: outbox.Schema(schema)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Attempt(ctx, "payments.charge", "k2"); err != nil {
		t.Fatalf("operator Attempt: %v", err)
	}
	waiting, err := a.Waiting(ctx, "payments.charge", "k2")
	if err != nil {
		t.Fatalf("operator Waiting: %v", err)
	}
	if len(waiting) != 1 {
		t.Fatalf("operator Waiting: %d events, want 1", len(waiting))
	}
	if _, err := a.Resolve(ctx, sideeffect.Resolution{Name: "payments.charge", Key: "k2", As: sideeffect.ResolveRetry, By: "op", Reason: "checked"}); err != nil {
		t.Fatalf("operator Resolve: %v", err)
	}
	rep, err := c.ResumeOnce(ctx, r)
	if err != nil || rep.Resumed != 1 {
		t.Fatalf("consumer ResumeOnce after the resolution: %+v, %v; want the event resumed", rep, err)
	}
}
