package sideeffect_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// realProvider is the example's payment provider (examples/orders/provider:
// an HTTP server over its own tables, whose ledger records every charge it
// made) on the test's schema, with a count of the charge requests it got.
type realProvider struct {
	client *provider.Client
	posts  atomic.Int64 // POST /charges received
}

func startProvider(t *testing.T, schema string, mode provider.Mode) *realProvider {
	t.Helper()
	pool := outboxtest.Pool(t)
	svc, err := provider.New(pool, provider.Config{Schema: schema, Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := &realProvider{}
	h := svc.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/charges" {
			p.posts.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.client = provider.NewClient(srv.URL, "", &http.Client{})
	return p
}

// charge is the Call of a charge of reference key, classified the way the
// example's payments consumer does it.
func (p *realProvider) charge(req provider.ChargeRequest) sideeffect.Call {
	return func(ctx context.Context, key string) ([]byte, error) {
		ch, err := p.client.Charge(ctx, key, req)
		b, _ := json.Marshal(ch)
		var api *provider.APIError
		switch {
		case err == nil:
			return b, nil
		case errors.Is(err, provider.ErrDeclined), errors.Is(err, provider.ErrInvalid), errors.Is(err, provider.ErrKeyReused):
			return b, sideeffect.Rejected(err)
		case !errors.As(err, &api):
			return nil, sideeffect.NotSent(err)
		}
		return nil, err
	}
}

// lookup asks the provider about a key: by key in idempotent mode, by
// reference (the key is the reference) in queryable mode.
func (p *realProvider) lookup(mode provider.Mode) sideeffect.Lookup {
	found := func(ch provider.Charge) (sideeffect.LookupResult, error) {
		b, err := json.Marshal(ch)
		return sideeffect.LookupResult{Found: true, Failed: ch.Status != provider.ChargeSucceeded, Response: b}, err
	}
	switch mode {
	case provider.ModeIdempotent:
		return sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
			ch, err := p.client.LookupByKey(ctx, key)
			if errors.Is(err, provider.ErrNotFound) {
				return sideeffect.LookupResult{}, nil
			}
			if err != nil {
				return sideeffect.LookupResult{}, err
			}
			return found(ch)
		})
	case provider.ModeQueryable:
		return sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
			chs, err := p.client.LookupByReference(ctx, key)
			if err != nil || len(chs) == 0 {
				return sideeffect.LookupResult{}, err
			}
			return found(chs[0])
		})
	}
	return nil
}

// charges counts the captured charges of reference in the provider's
// ledger.
func (p *realProvider) charges(t *testing.T, reference string) int {
	t.Helper()
	l, err := p.client.Ledger(context.Background(), reference)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range l.Entries {
		if e.Kind == "charge" {
			n++
		}
	}
	return n
}

// pauseFirstCall makes the first caller to reach the call after its claim
// sleep there for d (failpoint sideeffect/before-call), as a GC pause, a
// SIGSTOP or a frozen VM would. Process-wide: the tests using it are not
// parallel.
func pauseFirstCall(t *testing.T, d time.Duration) {
	t.Helper()
	if err := failpoint.Enable(sideeffect.FailpointBeforeCall+"=sleep("+d.String()+")@1", 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = failpoint.Enable("", 0) })
}

// Issue 19, item 3: a caller paused between its claim and its call, past its
// lease, must not call when it wakes. Meanwhile another caller (the
// event's redelivery) found the lease expired, looked the key up (nothing
// yet) and called. Before the fix the paused caller called too: the fence
// stopped its record, not its call, and a provider without idempotency keys
// charged twice. Now it re-checks its lease just before calling and refuses:
// the provider's ledger shows one charge, in every mode. Not parallel:
// failpoints are process-wide.
func TestPausedCallerDoesNotCallPastItsLease(t *testing.T) {
	const (
		callTimeout = time.Second
		lease       = 2 * time.Second // the paused caller's: a call must start within 0.5s of its claim
		pause       = 4 * time.Second // the paused caller wakes 2s after its lease ended
		// The redelivery's lease: its call must start within 29.5 s of
		// its claim, which a loaded machine does (with the paused
		// caller's 0.5 s, the redelivery failed whenever its own claim
		// and call were more than half a second apart).
		redeliveryLease = time.Minute
	)
	for _, c := range []struct {
		mode  provider.Mode
		smode sideeffect.Mode
	}{
		{provider.ModeIdempotent, sideeffect.Idempotent},
		{provider.ModeQueryable, sideeffect.Queryable},
		{provider.ModeNeither, sideeffect.Neither}, // with BlindRetry: the redelivery calls again
	} {
		t.Run(string(c.mode), func(t *testing.T) {
			pool, schema := outboxtest.Schema(t)
			p := startProvider(t, schema, c.mode)
			admin, err := sideeffect.NewAdmin(pool, sideeffect.AdminConfig{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			newCaller := func(lease time.Duration) *sideeffect.Caller {
				cfg := sideeffect.Config{Name: "payments.charge", Schema: schema, Mode: c.smode,
					Lookup: p.lookup(c.mode), CallTimeout: callTimeout, Lease: lease, BlindRetry: c.mode == provider.ModeNeither}
				caller, err := sideeffect.New(pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return caller
			}
			key := uuid.NewString()
			req := provider.ChargeRequest{Reference: key, Amount: 1250, Currency: "eur"}
			body, _ := json.Marshal(req)
			ctx := context.Background()

			pauseFirstCall(t, pause)
			type outcome struct {
				res sideeffect.Result
				err error
			}
			paused := make(chan outcome, 1)
			go func() {
				res, err := newCaller(lease).Do(ctx, key, body, p.charge(req))
				paused <- outcome{res, err}
			}()
			// The redelivery: once the paused caller's lease has ended.
			outboxtest.Eventually(t, 30*time.Second, "the paused caller's lease ends", func() bool {
				a, err := admin.Attempt(ctx, "payments.charge", key)
				return err == nil && a.Expired
			})
			res, err := newCaller(redeliveryLease).Do(ctx, key, body, p.charge(req))
			if err != nil || res.State != sideeffect.Succeeded || !res.Called {
				t.Fatalf("the redelivery's Do: %+v, %v; want it to call and succeed", res, err)
			}
			var got outcome
			select {
			case got = <-paused:
			case <-time.After(30 * time.Second):
				t.Fatal("the paused caller did not return")
			}
			if !errors.Is(got.err, sideeffect.ErrLeaseExpired) || got.res.Called || got.res.State == sideeffect.Succeeded {
				t.Errorf("the paused caller: state %s, called %v, %v; want ErrLeaseExpired, not called", got.res.State, got.res.Called, got.err)
			}
			if n := p.posts.Load(); n != 1 {
				t.Errorf("the provider got %d charge requests, want 1", n)
			}
			if n := p.charges(t, key); n != 1 {
				t.Errorf("the provider's ledger shows %d charges of %s, want 1", n, key)
			}
			a, err := admin.Attempt(ctx, "payments.charge", key)
			if err != nil || a.State != sideeffect.Succeeded || a.Attempts != 2 {
				// Two claims that may have called: the first (it did not,
				// but no one can know that from the record) and the
				// redelivery's.
				t.Errorf("the attempt: %+v, %v; want succeeded after 2 attempts", a, err)
			}
		})
	}
}

// The reconciler claims a batch with one lease and looks the attempts up one
// after the other: a slow lookup must not push the next ones past the
// batch's lease, when another caller may own them. An attempt whose turn
// comes too late is given back undone, due again at once, its check not
// counted. Here the first lookup takes its whole CallTimeout (the provider
// does not answer), which leaves no room for a second within the lease:
// before the fix the reconciler looked all three up, the last ones after the
// lease had run out.
func TestReconcilerLooksUpOnlyWithinItsLease(t *testing.T) {
	b := setup(t, sideeffect.Queryable)
	ctx := context.Background()
	var lookups atomic.Int64
	hang := sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
		lookups.Add(1)
		<-ctx.Done() // CallTimeout
		return sideeffect.LookupResult{}, ctx.Err()
	})
	// A lookup must start within (Lease - CallTimeout)/2 = 5s of the
	// claim; each takes 5s. The first starts at once (5 s is room for a
	// loaded machine: with 500 ms, a slow start deferred it too); the
	// second starts 5 s after it at least, whatever the load: too late.
	c := b.caller(t, func(cfg *sideeffect.Config) {
		cfg.Lookup, cfg.CallTimeout, cfg.Lease = hang, 5*time.Second, 15*time.Second
	})
	call, req := b.p.call(10)
	keys := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	for _, k := range keys {
		b.p.inject(faultDropBeforeCommit)
		if _, err := c.Do(ctx, k, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
			t.Fatal(err)
		}
		b.due(t, k)
	}
	rep, err := c.ReconcileOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := lookups.Load(); n != 1 || rep.Checked != 3 || rep.LookupErrors != 1 || rep.Deferred != 2 {
		t.Fatalf("%d lookups, report %+v; want 1 lookup (an error) and 2 attempts deferred", n, rep)
	}
	deferred := 0
	for _, k := range keys {
		a := b.attempt(t, k)
		if a.State != sideeffect.Unknown {
			t.Fatalf("%s after the round: %+v, want unknown", k, a)
		}
		if a.Checks == 0 {
			deferred++
			if a.NextCheck == nil || a.NextCheck.After(time.Now()) {
				t.Errorf("deferred %s is not due: %+v", k, a)
			}
		}
	}
	if deferred != 2 {
		t.Fatalf("%d attempts with no check counted, want the 2 deferred", deferred)
	}
}
