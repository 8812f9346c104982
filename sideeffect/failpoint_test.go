package sideeffect_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// The failpoints chaos uses to kill a consumer around the call, here with
// the error action (a crash is the same to the next caller, after the
// lease): after the call, nothing is recorded and the attempt stays started;
// before it, nothing is called. Either way the next caller, once the lease
// ended, settles the key with one charge. Not parallel: failpoints are
// process-wide.
func TestFailpointsAroundTheCall(t *testing.T) {
	for _, c := range []struct {
		name   string
		called bool
	}{{sideeffect.FailpointAfterCallBeforeRecord, true}, {sideeffect.FailpointBeforeCall, false}} {
		t.Run(c.name, func(t *testing.T) {
			pool, schema := outboxtest.Schema(t)
			admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			b := &bundle{pool: pool, schema: schema, p: newFakeProvider(t, sideeffect.Queryable), obs: &recorder{}, admin: admin}
			ctx := context.Background()
			c1 := b.caller(t, nil)
			key := uuid.NewString()
			call, req := b.p.call(20)
			if err := failpoint.Enable(c.name+"=error@1", 1); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = failpoint.Enable("", 0) })
			if _, err := c1.Do(ctx, key, req, call); !errors.Is(err, failpoint.ErrInjected) {
				t.Fatalf("Do: %v, want the injected error", err)
			}
			a := b.attempt(t, key)
			if a.State != sideeffect.Started || a.Attempts != 1 {
				t.Fatalf("after the injected fault: %+v, want started", a)
			}
			if got := b.p.charges(key); got != map[bool]int{true: 1, false: 0}[c.called] {
				t.Fatalf("%d charges before the next caller", got)
			}
			b.expire(t, key)
			res, err := b.caller(t, nil).Do(ctx, key, req, call)
			if err != nil || res.State != sideeffect.Succeeded || res.Called == c.called {
				t.Fatalf("next caller: %+v, %v (it should call only if the first did not)", res, err)
			}
			if n := b.p.charges(key); n != 1 {
				t.Fatalf("%d charges, want 1", n)
			}
		})
	}
}
