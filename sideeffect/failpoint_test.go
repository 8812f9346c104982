package sideeffect_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

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

// Environment of the child process of TestProcessKilledBetweenCallAndRecord.
const (
	childSchemaEnv = "SIDEEFFECT_TEST_CHILD_SCHEMA"
	childURLEnv    = "SIDEEFFECT_TEST_CHILD_PROVIDER"
	childKeyEnv    = "SIDEEFFECT_TEST_CHILD_KEY"
)

// A real crash: a consumer process is SIGKILLed (failpoint crash) after the
// provider charged and before the outcome is recorded. The attempt stays
// started; once its lease has ended a fresh process looks the key up, finds
// the charge and records it: one charge, no second call.
func TestProcessKilledBetweenCallAndRecord(t *testing.T) {
	if schema := os.Getenv(childSchemaEnv); schema != "" {
		runChild(t, schema)
		return
	}
	pool, schema := outboxtest.Schema(t)
	admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{pool: pool, schema: schema, p: newFakeProvider(t, sideeffect.Queryable), obs: &recorder{}, admin: admin}
	key := uuid.NewString()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestProcessKilledBetweenCallAndRecord$", "-test.count=1")
	cmd.Env = append(os.Environ(), childSchemaEnv+"="+schema, childURLEnv+"="+b.p.url, childKeyEnv+"="+key,
		failpoint.EnvVar+"="+sideeffect.FailpointAfterCallBeforeRecord+"=crash")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child was not killed by the failpoint: %v\n%s", err, out)
	}
	a := b.attempt(t, key)
	if a.State != sideeffect.Started || a.Attempts != 1 || b.p.charges(key) != 1 {
		t.Fatalf("after the crash: %+v, %d charges; want started, charged once", a, b.p.charges(key))
	}
	b.expire(t, key)
	call, req := b.p.call(20)
	res, err := b.caller(t, nil).Do(ctx, key, req, call)
	if err != nil || res.State != sideeffect.Succeeded || res.Called || res.Via != "lookup" {
		t.Fatalf("the next process: %+v, %v; want the charge found by lookup", res, err)
	}
	if posts, _ := b.p.counts(); posts != 1 || b.p.charges(key) != 1 {
		t.Fatalf("%d calls, %d charges; want 1 and 1", posts, b.p.charges(key))
	}
}

// runChild is the consumer process that the failpoint kills.
func runChild(t *testing.T, schema string) {
	pool := outboxtest.Pool(t)
	p := &fakeProvider{url: os.Getenv(childURLEnv), client: &http.Client{}, hung: make(chan struct{})}
	c, err := sideeffect.New(pool, sideeffect.Config{Name: "payments.charge", Schema: schema, Mode: sideeffect.Queryable,
		Lookup: sideeffect.LookupFunc(func(context.Context, string) (sideeffect.LookupResult, error) {
			return sideeffect.LookupResult{}, errors.New("unused")
		})})
	if err != nil {
		t.Fatal(err)
	}
	call, req := p.call(20)
	_, err = c.Do(context.Background(), os.Getenv(childKeyEnv), req, call)
	t.Fatalf("the failpoint did not kill the process (Do returned %v)", err)
}
