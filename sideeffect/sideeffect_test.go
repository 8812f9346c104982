package sideeffect_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// bundle is one test's database, provider and caller.
type bundle struct {
	kind   txKind
	pool   *pgxpool.Pool
	schema string
	p      *fakeProvider
	obs    *recorder
	admin  *sideeffect.Admin
}

// setup is setupKind on pgx.
func setup(t *testing.T, mode sideeffect.Mode) *bundle {
	t.Helper()
	return setupKind(t, mode, txKinds[0])
}

// setupKind is a bundle whose Callers and Admin run on transactions of kind
// k. It marks the test parallel.
func setupKind(t *testing.T, mode sideeffect.Mode, k txKind) *bundle {
	t.Helper()
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	admin := k.newAdmin(t, pool, sideeffect.AdminConfig{Tables: outbox.Schema(schema)})
	return &bundle{kind: k, pool: pool, schema: schema, p: newFakeProvider(t, mode), obs: &recorder{}, admin: admin}
}

// caller returns a Caller of the bundle's mode; edit adjusts its Config.
func (b *bundle) caller(t *testing.T, edit func(*sideeffect.Config)) *sideeffect.Caller {
	t.Helper()
	cfg := sideeffect.Config{Name: "payments.charge", Schema: b.schema, Mode: b.p.mode, Observer: b.obs,
		CallTimeout: 10 * time.Second}
	if b.p.mode == sideeffect.Queryable {
		cfg.Lookup = b.p.lookupFn()
	}
	if edit != nil {
		edit(&cfg)
	}
	return b.kind.newCaller(t, b.pool, cfg)
}

func (b *bundle) attempt(t *testing.T, key string) sideeffect.Attempt {
	t.Helper()
	a, err := b.admin.Attempt(context.Background(), "payments.charge", key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// expire ends the lease of a started attempt, as time passing would: its
// caller is then presumed dead.
func (b *bundle) expire(t *testing.T, key string) {
	t.Helper()
	tag, err := b.pool.Exec(context.Background(), `UPDATE `+b.schema+`.side_effects
SET lease_until = now() - interval '1 second', next_check_at = now() - interval '1 second'
WHERE key = $1 AND state = 'started'`, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("expire the lease of %s: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

// due makes an unknown attempt's next check due now, as its backoff passing
// would.
func (b *bundle) due(t *testing.T, key string) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `UPDATE `+b.schema+`.side_effects
SET next_check_at = now() - interval '1 millisecond' WHERE key = $1 AND state = 'unknown'`, key); err != nil {
		t.Fatal(err)
	}
}

// recorder is an Observer that counts.
type recorder struct {
	mu  sync.Mutex
	obs []sideeffect.Observation
}

func (r *recorder) ObserveSideEffect(o sideeffect.Observation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.obs = append(r.obs, o)
}

func (r *recorder) count(pred func(sideeffect.Observation) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, o := range r.obs {
		if pred(o) {
			n++
		}
	}
	return n
}

func mustState(t *testing.T, res sideeffect.Result, want sideeffect.State) {
	t.Helper()
	if res.State != want {
		t.Fatalf("state %s, want %s (result %+v)", res.State, want, res)
	}
}

// Idempotent provider: the provider charges, then the response times out.
// The retry uses the same key and gets the stored response: one charge.
func TestIdempotentTimeoutAfterCommitThenRetryChargesOnce(t *testing.T) {
	t.Parallel()
	forKinds(t, testIdempotentTimeoutAfterCommitThenRetryChargesOnce)
}

func testIdempotentTimeoutAfterCommitThenRetryChargesOnce(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Idempotent, k)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(1299)

	b.p.inject(faultHangAfterCommit)
	res, err := c.Do(ctx, key, req, call)
	if !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("first Do: %v, want ErrUnknown", err)
	}
	mustState(t, res, sideeffect.Unknown)
	if a := b.attempt(t, key); a.State != sideeffect.Unknown || a.Attempts != 1 || a.UnknownSince == nil {
		t.Fatalf("recorded %+v, want unknown after 1 attempt", a)
	}

	res, err = c.Do(ctx, key, req, call)
	if err != nil {
		t.Fatal(err)
	}
	mustState(t, res, sideeffect.Succeeded)
	if !res.Called || res.Attempts != 2 || res.Via != "call" || len(res.Response) == 0 {
		t.Fatalf("retry: %+v", res)
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("provider charged %d times, want 1", n)
	}
	// A third Do replays: no call.
	posts, _ := b.p.counts()
	res, err = c.Do(ctx, key, req, call)
	if err != nil || !res.Replayed || res.Called {
		t.Fatalf("third Do: %+v, %v", res, err)
	}
	if p2, _ := b.p.counts(); p2 != posts {
		t.Fatalf("a replay called the provider (%d -> %d posts)", posts, p2)
	}
}

// Queryable provider: the charge commits, the response times out; the
// reconciler finds the charge by key and records it; the next Do replays
// it without calling again.
func TestQueryableReconcilerResolvesTimeoutAfterCommit(t *testing.T) {
	t.Parallel()
	forKinds(t, testQueryableReconcilerResolvesTimeoutAfterCommit)
}

func testQueryableReconcilerResolvesTimeoutAfterCommit(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Queryable, k)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(500)

	b.p.inject(faultDropAfterCommit)
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("first Do: %v, want ErrUnknown", err)
	}
	b.due(t, key)
	rep, err := c.ReconcileOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Checked != 1 || rep.Succeeded != 1 {
		t.Fatalf("reconcile: %+v", rep)
	}
	if a := b.attempt(t, key); a.State != sideeffect.Succeeded || a.Via != "lookup" || a.Checks != 1 || len(a.Response) == 0 {
		t.Fatalf("recorded %+v", a)
	}
	posts, _ := b.p.counts()
	res, err := c.Do(ctx, key, req, call)
	if err != nil || !res.Replayed || res.State != sideeffect.Succeeded {
		t.Fatalf("Do after reconcile: %+v, %v", res, err)
	}
	if p2, _ := b.p.counts(); p2 != posts {
		t.Fatal("Do called the provider after the reconciler resolved the attempt")
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("provider charged %d times, want 1", n)
	}
	if n := b.obs.count(func(o sideeffect.Observation) bool {
		return o.Op == sideeffect.OpLookup && o.LookupResult == sideeffect.LookupSucceeded
	}); n != 1 {
		t.Fatalf("observed %d successful lookups, want 1", n)
	}
}

// Queryable provider: the request is lost before the provider committed.
// The retry looks the key up first (not found) and only then calls: one
// charge.
func TestQueryableLostBeforeCommitLooksUpThenCallsOnce(t *testing.T) {
	b := setup(t, sideeffect.Queryable)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(700)

	b.p.inject(faultDropBeforeCommit)
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("first Do: %v, want ErrUnknown", err)
	}
	res, err := c.Do(ctx, key, req, call)
	if err != nil {
		t.Fatal(err)
	}
	mustState(t, res, sideeffect.Succeeded)
	posts, lookups := b.p.counts()
	if posts != 2 || lookups != 1 {
		t.Fatalf("provider saw %d posts and %d lookups, want 2 and 1", posts, lookups)
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("provider charged %d times, want 1", n)
	}
	if a := b.attempt(t, key); a.Attempts != 2 || a.Checks != 1 {
		t.Fatalf("recorded %+v, want 2 attempts and 1 check", a)
	}
}

// Queryable provider: the charge commits and the response is lost; the
// retrying Do looks up first and finds it: no second call.
func TestQueryableDoLooksUpBeforeRetrying(t *testing.T) {
	b := setup(t, sideeffect.Queryable)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(700)
	b.p.inject(fault503AfterCommit)
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("first Do: %v, want ErrUnknown", err)
	}
	res, err := c.Do(ctx, key, req, call)
	if err != nil || res.State != sideeffect.Succeeded || res.Called || res.Via != "lookup" {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("provider charged %d times, want 1", n)
	}
}

// Neither: without BlindRetry an unknown attempt is parked; with it, the
// retry charges again and the duplicate is counted.
func TestNeitherParksOrCountsBlindRetries(t *testing.T) {
	t.Parallel()
	forKinds(t, testNeitherParksOrCountsBlindRetries)
}

func testNeitherParksOrCountsBlindRetries(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Neither, k)
	ctx := context.Background()

	parking := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(100)
	b.p.inject(faultDropAfterCommit)
	if _, err := parking.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("first Do: %v", err)
	}
	res, err := parking.Do(ctx, key, req, call)
	if !errors.Is(err, sideeffect.ErrParked) || res.State != sideeffect.Parked {
		t.Fatalf("retry without BlindRetry: %+v, %v; want parked", res, err)
	}
	if a := b.attempt(t, key); a.State != sideeffect.Parked || a.ParkReason == "" || a.BlindRetries != 0 {
		t.Fatalf("recorded %+v", a)
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("provider charged %d times, want 1", n)
	}

	blind := b.caller(t, func(cfg *sideeffect.Config) { cfg.BlindRetry = true })
	key2 := uuid.NewString()
	b.p.inject(faultDropAfterCommit)
	if _, err := blind.Do(ctx, key2, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("first Do: %v", err)
	}
	res, err = blind.Do(ctx, key2, req, call)
	if err != nil || res.State != sideeffect.Succeeded {
		t.Fatalf("blind retry: %+v, %v", res, err)
	}
	if n := b.p.charges(key2); n != 2 {
		t.Fatalf("provider charged %d times; the fake has no dedup, want the duplicate (2)", n)
	}
	if a := b.attempt(t, key2); a.BlindRetries != 1 || a.Attempts != 2 {
		t.Fatalf("recorded %+v, want 1 blind retry in 2 attempts", a)
	}
	if n := b.obs.count(func(o sideeffect.Observation) bool { return o.Op == sideeffect.OpCall && o.Blind }); n != 1 {
		t.Fatalf("observed %d blind calls, want 1", n)
	}
	st, err := b.admin.Status(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Names) != 1 || st.Names[0].BlindRetries != 1 || st.Names[0].Parked != 1 || st.Names[0].Succeeded != 1 {
		t.Fatalf("status %+v", st.Names)
	}
}

// The bound: a provider that never answers the lookup gets MaxChecks checks,
// then the attempt is parked with its reason; an operator's retry lets the
// next Do call again, recorded with who and why.
func TestReconcilerParksPastTheBoundAndOperatorRetries(t *testing.T) {
	t.Parallel()
	forKinds(t, testReconcilerParksPastTheBoundAndOperatorRetries)
}

func testReconcilerParksPastTheBoundAndOperatorRetries(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Idempotent, k)
	ctx := context.Background()
	var failLookups atomic.Bool
	failLookups.Store(true)
	lookup := b.p.lookupFn()
	c := b.caller(t, func(cfg *sideeffect.Config) {
		cfg.MaxChecks = 3
		cfg.Lookup = sideeffect.LookupFunc(func(ctx context.Context, key string) (sideeffect.LookupResult, error) {
			if failLookups.Load() {
				return sideeffect.LookupResult{}, errors.New("provider lookup unavailable")
			}
			return lookup.Lookup(ctx, key)
		})
	})
	key := uuid.NewString()
	call, req := b.p.call(42)
	b.p.inject(faultDropBeforeCommit)
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("first Do: %v", err)
	}
	for i := 1; i <= 3; i++ {
		b.due(t, key)
		rep, err := c.ReconcileOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.LookupErrors != 1 {
			t.Fatalf("round %d: %+v", i, rep)
		}
		a := b.attempt(t, key)
		if i < 3 && (a.State != sideeffect.Unknown || a.Checks != i) {
			t.Fatalf("round %d: %+v", i, a)
		}
		if i == 3 && (a.State != sideeffect.Parked || rep.Parked != 1) {
			t.Fatalf("after MaxChecks: %+v (report %+v), want parked", a, rep)
		}
	}
	if rep, err := c.ReconcileOnce(ctx); err != nil || rep.Checked != 0 {
		t.Fatalf("a parked attempt was checked again: %+v, %v", rep, err)
	}
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrParked) {
		t.Fatalf("Do on a parked attempt: %v", err)
	}
	page, err := b.admin.Parked(ctx, sideeffect.ParkedFilter{})
	if err != nil || len(page.Attempts) != 1 || page.Attempts[0].ParkReason == "" {
		t.Fatalf("parked list: %+v, %v", page, err)
	}
	if _, err := b.admin.Resolve(ctx, sideeffect.Resolution{Name: c.Name(), Key: key, As: sideeffect.ResolveRetry, By: "alice"}); !errors.Is(err, sideeffect.ErrReasonRequired) {
		t.Fatalf("resolve without reason: %v", err)
	}
	a, err := b.admin.Resolve(ctx, sideeffect.Resolution{Name: c.Name(), Key: key, As: sideeffect.ResolveRetry,
		By: "alice", Reason: "provider lookup is back"})
	if err != nil {
		t.Fatal(err)
	}
	if a.State != sideeffect.Unknown || !a.OperatorRetry || a.Operator == nil || a.Operator.By != "alice" || a.Checks != 0 {
		t.Fatalf("resolved %+v", a)
	}
	failLookups.Store(false)
	res, err := c.Do(ctx, key, req, call)
	if err != nil || res.State != sideeffect.Succeeded || !res.Called {
		t.Fatalf("Do after retry: %+v, %v", res, err)
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("provider charged %d times, want 1", n)
	}
	var audits int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.schema+`.outbox_operations
WHERE action = 'sideeffect_resolve' AND actor = 'alice' AND detail->>'key' = $1 AND detail->>'to' = 'retry'`, key).Scan(&audits); err != nil || audits != 1 {
		t.Fatalf("audit rows %d, %v", audits, err)
	}
	if _, err := b.admin.Resolve(ctx, sideeffect.Resolution{Name: c.Name(), Key: key, As: sideeffect.ResolveFailed, By: "bob", Reason: "x"}); !errors.Is(err, sideeffect.ErrFinal) {
		t.Fatalf("resolve a final attempt: %v, want ErrFinal", err)
	}
}

// Two (here eight) consumers handle the same event at once: exactly one
// calls, the others find the attempt in progress or its outcome.
func TestConcurrentDoCallsOnce(t *testing.T) {
	t.Parallel()
	forKinds(t, testConcurrentDoCallsOnce)
}

func testConcurrentDoCallsOnce(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Neither, k) // no dedup at the provider: a second call would show
	ctx := context.Background()
	key := uuid.NewString()
	inner, req := b.p.call(900)
	release := make(chan struct{})
	var calls atomic.Int32
	call := func(ctx context.Context, k string) ([]byte, error) {
		calls.Add(1)
		<-release // hold the claim until every other caller has tried
		return inner(ctx, k)
	}
	const n = 8
	results := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		c := b.caller(t, nil) // one Caller per consumer process
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Do(ctx, key, req, call)
			results <- err
		}()
	}
	inProgress := 0
	for range n - 1 {
		err := <-results
		if !errors.Is(err, sideeffect.ErrInProgress) {
			t.Errorf("a concurrent Do returned %v, want ErrInProgress", err)
		}
		inProgress++
	}
	close(release)
	wg.Wait()
	if err := <-results; err != nil {
		t.Fatalf("the Do that called: %v", err)
	}
	if calls.Load() != 1 || b.p.charges(key) != 1 {
		t.Fatalf("%d calls, %d charges; want 1 and 1", calls.Load(), b.p.charges(key))
	}
}

// A retry with another request under the same key is a programming error.
func TestFingerprintMismatchRefused(t *testing.T) {
	t.Parallel()
	forKinds(t, testFingerprintMismatchRefused)
}

func testFingerprintMismatchRefused(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Idempotent, k)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(100)
	if _, err := c.Do(ctx, key, req, call); err != nil {
		t.Fatal(err)
	}
	other, req2 := b.p.call(200)
	if _, err := c.Do(ctx, key, req2, other); !errors.Is(err, sideeffect.ErrFingerprintMismatch) {
		t.Fatalf("Do with another request: %v, want ErrFingerprintMismatch", err)
	}
	if posts, _ := b.p.counts(); posts != 1 {
		t.Fatalf("%d calls, want 1", posts)
	}
	// The same while the outcome is unknown: no retry with the other request.
	key2 := uuid.NewString()
	b.p.inject(faultDropBeforeCommit)
	if _, err := c.Do(ctx, key2, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, key2, req2, other); !errors.Is(err, sideeffect.ErrFingerprintMismatch) {
		t.Fatalf("retry of an unknown attempt with another request: %v, want ErrFingerprintMismatch", err)
	}
	if posts, _ := b.p.counts(); posts != 2 {
		t.Fatalf("%d calls, want 2", posts)
	}
}

// A definite refusal is recorded as failed and never called again.
func TestRejectedIsFinal(t *testing.T) {
	t.Parallel()
	forKinds(t, testRejectedIsFinal)
}

func testRejectedIsFinal(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Idempotent, k)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	b.p.declined[key] = true
	call, req := b.p.call(100)
	res, err := c.Do(ctx, key, req, call)
	if err != nil || res.State != sideeffect.Failed || string(res.Response) != `{"error":"card_declined"}` || res.Error == "" {
		t.Fatalf("declined: %+v, %v", res, err)
	}
	res, err = c.Do(ctx, key, req, call)
	if err != nil || !res.Replayed || res.State != sideeffect.Failed {
		t.Fatalf("second Do: %+v, %v", res, err)
	}
	if posts, _ := b.p.counts(); posts != 1 {
		t.Fatalf("%d calls, want 1", posts)
	}
}

// A call that never left records nothing against the provider: the next Do
// calls again, and no attempt is counted for it.
func TestNotSentLeavesNoAttempt(t *testing.T) {
	t.Parallel()
	forKinds(t, testNotSentLeavesNoAttempt)
}

func testNotSentLeavesNoAttempt(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Neither, k)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(100)
	refused := func(ctx context.Context, key string) ([]byte, error) {
		return nil, sideeffect.NotSent(errors.New("connection refused"))
	}
	if _, err := c.Do(ctx, key, req, refused); err == nil || errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatalf("not sent: %v", err)
	}
	if _, err := b.admin.Attempt(ctx, c.Name(), key); !errors.Is(err, sideeffect.ErrNotFound) {
		t.Fatalf("the attempt of a call not sent was kept: %v", err)
	}
	res, err := c.Do(ctx, key, req, call)
	if err != nil || res.State != sideeffect.Succeeded || res.Attempts != 1 {
		t.Fatalf("Do after not sent: %+v, %v", res, err)
	}
}

// A crash between the call and the record: the call charged, the process
// died (here: the call panics after the provider answered). The attempt
// stays started; a fresh Caller treats it as in progress until the lease
// ends, then as unknown, and resolves it without a second charge.
func TestCrashBetweenCallAndRecord(t *testing.T) {
	for _, mode := range []sideeffect.Mode{sideeffect.Idempotent, sideeffect.Queryable} {
		t.Run(mode.String(), func(t *testing.T) {
			b := setup(t, mode)
			ctx := context.Background()
			key := uuid.NewString()
			call, req := b.p.call(1000)
			crashing := func(ctx context.Context, k string) ([]byte, error) {
				if _, err := call(ctx, k); err != nil {
					t.Errorf("the call before the crash: %v", err)
				}
				panic("crash after the provider call")
			}
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("the call did not panic")
					}
				}()
				c := b.caller(t, nil)
				c.Do(ctx, key, req, crashing) //nolint:errcheck
			}()
			if a := b.attempt(t, key); a.State != sideeffect.Started || a.Expired {
				t.Fatalf("after the crash: %+v, want started under a live lease", a)
			}
			fresh := b.caller(t, nil)
			if _, err := fresh.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrInProgress) {
				t.Fatalf("Do under the dead caller's lease: %v, want ErrInProgress", err)
			}
			b.expire(t, key)
			if a := b.attempt(t, key); !a.Expired {
				t.Fatalf("not expired: %+v", a)
			}
			g, err := b.admin.Gauges(ctx)
			if err != nil || len(g) != 1 || g[0].Unknown != 1 || g[0].Started != 0 || g[0].OldestUnknownAgeSeconds <= 0 {
				t.Fatalf("gauges %+v, %v: an expired started attempt counts as unknown", g, err)
			}
			res, err := fresh.Do(ctx, key, req, call)
			if err != nil || res.State != sideeffect.Succeeded {
				t.Fatalf("Do after the lease: %+v, %v", res, err)
			}
			if mode == sideeffect.Queryable && res.Called {
				t.Fatal("queryable: Do called again instead of finding the charge")
			}
			if n := b.p.charges(key); n != 1 {
				t.Fatalf("provider charged %d times, want 1", n)
			}
		})
	}
}

// The reconciler turns a crashed caller's attempt (started, lease expired)
// into a result, and a not-found lookup leaves it for the next Do.
func TestReconcilerExpiredLeaseAndNotFound(t *testing.T) {
	b := setup(t, sideeffect.Queryable)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(10)
	b.p.inject(faultDropBeforeCommit)
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	b.due(t, key)
	rep, err := c.ReconcileOnce(ctx)
	if err != nil || rep.NotFound != 1 {
		t.Fatalf("reconcile: %+v, %v", rep, err)
	}
	if a := b.attempt(t, key); a.State != sideeffect.Unknown || a.NextCheck == nil || !a.NextCheck.After(time.Now().Add(-time.Minute)) {
		t.Fatalf("after not found: %+v", a)
	}
	res, err := c.Do(ctx, key, req, call)
	if err != nil || !res.Called || res.State != sideeffect.Succeeded {
		t.Fatalf("Do: %+v, %v", res, err)
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("charged %d, want 1", n)
	}
}

// Admin.Parked pages through parked attempts, oldest first, without gaps
// or repeats.
func TestParkedPagination(t *testing.T) {
	t.Parallel()
	forKinds(t, testParkedPagination)
}

func testParkedPagination(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Neither, k)
	ctx := context.Background()
	c := b.caller(t, nil)
	call, req := b.p.call(1)
	const n = 7
	for range n {
		key := uuid.NewString()
		b.p.inject(faultDropAfterCommit)
		if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
			t.Fatal(err)
		}
		if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrParked) {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	var after *sideeffect.Cursor
	pages := 0
	for {
		page, err := b.admin.Parked(ctx, sideeffect.ParkedFilter{Limit: 3, After: after})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, a := range page.Attempts {
			if seen[a.Key] {
				t.Fatalf("%s listed twice", a.Key)
			}
			seen[a.Key] = true
		}
		if page.Next == nil {
			break
		}
		after = page.Next
	}
	if len(seen) != n || pages != 3 {
		t.Fatalf("%d attempts in %d pages, want %d in 3", len(seen), pages, n)
	}
}

// Property: whatever sequence of ambiguous faults hits the calls (timeouts
// and lost responses after the provider committed, requests lost before it,
// 5xx after it), retrying Do and reconciling in any interleaving ends with
// the key succeeded and exactly one charge, in the two modes that promise
// it. The seed is logged; the faults are drawn from it.
func TestPropertyOneChargePerKeyUnderFaults(t *testing.T) {
	for _, mode := range []sideeffect.Mode{sideeffect.Idempotent, sideeffect.Queryable} {
		t.Run(mode.String(), func(t *testing.T) {
			b := setup(t, mode)
			ctx := context.Background()
			seed := time.Now().UnixNano()
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(uint64(seed), 0))
			c := b.caller(t, nil)
			faults := []fault{faultHangAfterCommit, faultDropAfterCommit, faultDropBeforeCommit, fault503AfterCommit}
			for i := range 25 {
				key := uuid.NewString()
				call, req := b.p.call(i + 1)
				nf := rng.IntN(4)
				for range nf {
					b.p.inject(faults[rng.IntN(len(faults))])
				}
				var res sideeffect.Result
				var err error
				for round := 0; round < 10 && res.State != sideeffect.Succeeded; round++ {
					if rng.IntN(2) == 0 {
						b.due(t, key)
						if _, rerr := c.ReconcileOnce(ctx); rerr != nil {
							t.Fatal(rerr)
						}
					}
					res, err = c.Do(ctx, key, req, call)
					if err != nil && !errors.Is(err, sideeffect.ErrUnknown) {
						t.Fatalf("key %d (%d faults): %v", i, nf, err)
					}
				}
				if res.State != sideeffect.Succeeded {
					t.Fatalf("key %d (%d faults): not succeeded after 10 rounds: %+v", i, nf, res)
				}
				if n := b.p.charges(key); n != 1 {
					t.Fatalf("key %d (%d faults): %d charges, want 1", i, nf, n)
				}
				b.p.mu.Lock()
				b.p.faults = nil // faults not consumed (a lookup resolved it first)
				b.p.mu.Unlock()
			}
		})
	}
}

// Do itself applies the bound: a retry whose lookup finds nothing and whose
// call is lost again, past MaxChecks, parks the attempt and says so.
func TestDoParksPastMaxChecks(t *testing.T) {
	b := setup(t, sideeffect.Queryable)
	ctx := context.Background()
	c := b.caller(t, func(cfg *sideeffect.Config) { cfg.MaxChecks = 1 })
	key := uuid.NewString()
	call, req := b.p.call(5)
	b.p.inject(faultDropBeforeCommit, faultDropBeforeCommit)
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	res, err := c.Do(ctx, key, req, call)
	if !errors.Is(err, sideeffect.ErrParked) || res.State != sideeffect.Parked {
		t.Fatalf("second Do: %+v, %v; want parked", res, err)
	}
	if a := b.attempt(t, key); a.State != sideeffect.Parked || a.Checks != 1 || a.Attempts != 2 {
		t.Fatalf("recorded %+v", a)
	}
}

// A caller that stalls past its lease loses the attempt: another caller
// claims it, and the stalled one's write-back is refused by the fence
// instead of overwriting the new owner's claim.
func TestStalledCallerCannotOverwriteNewOwner(t *testing.T) {
	b := setup(t, sideeffect.Idempotent)
	ctx := context.Background()
	key := uuid.NewString()
	call, req := b.p.call(300)
	stalled, next := b.caller(t, nil), b.caller(t, nil)
	bClaimed, releaseB := make(chan struct{}), make(chan struct{})
	bDone := make(chan error, 1)
	slow := func(callCtx context.Context, k string) ([]byte, error) {
		resp, err := call(callCtx, k)
		b.expire(t, k) // the stall: the lease ends meanwhile
		go func() {
			_, err := next.Do(ctx, k, req, func(ctx context.Context, k string) ([]byte, error) {
				close(bClaimed)
				<-releaseB
				return call(ctx, k)
			})
			bDone <- err
		}()
		<-bClaimed
		return resp, err
	}
	_, err := stalled.Do(ctx, key, req, slow)
	if !errors.Is(err, sideeffect.ErrLeaseLost) {
		t.Fatalf("stalled caller: %v, want ErrLeaseLost", err)
	}
	if a := b.attempt(t, key); a.State != sideeffect.Started || a.Expired {
		t.Fatalf("the new owner's claim was overwritten: %+v", a)
	}
	close(releaseB)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if a := b.attempt(t, key); a.State != sideeffect.Succeeded || a.Attempts != 2 {
		t.Fatalf("after the new owner: %+v", a)
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("charged %d, want 1", n)
	}
}

// The bound holds whoever meets the attempt first: past MaxAge (or past a
// MaxChecks lowered since), Do and the reconciler park without calling or
// asking.
func TestBoundAppliesBeforeAnyCallOrLookup(t *testing.T) {
	b := setup(t, sideeffect.Queryable)
	ctx := context.Background()
	c := b.caller(t, nil)
	call, req := b.p.call(5)
	keys := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	for _, k := range keys {
		b.p.inject(faultDropBeforeCommit)
		if _, err := c.Do(ctx, k, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
			t.Fatal(err)
		}
	}
	// keys[0], keys[1]: unknown for 25 hours; keys[2]: 3 checks already.
	if _, err := b.pool.Exec(ctx, `UPDATE `+b.schema+`.side_effects SET unknown_since = now() - interval '25 hours' WHERE key = ANY($1)`, keys[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE `+b.schema+`.side_effects SET checks = 3 WHERE key = $1`, keys[2]); err != nil {
		t.Fatal(err)
	}
	posts, lookups := b.p.counts()
	if _, err := c.Do(ctx, keys[0], req, call); !errors.Is(err, sideeffect.ErrParked) || !strings.Contains(err.Error(), "MaxAge") {
		t.Fatalf("Do past MaxAge: %v", err)
	}
	b.due(t, keys[1])
	if rep, err := c.ReconcileOnce(ctx); err != nil || rep.Parked != 1 {
		t.Fatalf("reconcile past MaxAge: %+v, %v", rep, err)
	}
	strict := b.caller(t, func(cfg *sideeffect.Config) { cfg.MaxChecks = 2 })
	if _, err := strict.Do(ctx, keys[2], req, call); !errors.Is(err, sideeffect.ErrParked) || !strings.Contains(err.Error(), "MaxChecks") {
		t.Fatalf("Do past a lowered MaxChecks: %v", err)
	}
	if p2, l2 := b.p.counts(); p2 != posts || l2 != lookups {
		t.Fatalf("the provider was called (%d -> %d) or asked (%d -> %d) past the bound", posts, p2, lookups, l2)
	}
	for _, k := range keys {
		if a := b.attempt(t, k); a.State != sideeffect.Parked {
			t.Fatalf("%s: %+v, want parked", k, a)
		}
	}
}

// An operator who checked with the provider settles a parked attempt as
// succeeded, with the response; Do then replays it and never calls.
func TestOperatorResolvesParkedAsSucceeded(t *testing.T) {
	t.Parallel()
	forKinds(t, testOperatorResolvesParkedAsSucceeded)
}

func testOperatorResolvesParkedAsSucceeded(t *testing.T, k txKind) {
	b := setupKind(t, sideeffect.Neither, k)
	ctx := context.Background()
	c := b.caller(t, nil)
	key := uuid.NewString()
	call, req := b.p.call(77)
	b.p.inject(faultDropAfterCommit)
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, key, req, call); !errors.Is(err, sideeffect.ErrParked) {
		t.Fatal(err)
	}
	a, err := b.admin.Resolve(ctx, sideeffect.Resolution{Name: c.Name(), Key: key, As: sideeffect.ResolveSucceeded,
		Response: []byte(`{"id":1}`), By: "carol", Reason: "charge ch_1 seen in the provider's dashboard"})
	if err != nil {
		t.Fatal(err)
	}
	if a.State != sideeffect.Succeeded || a.Via != "operator" || string(a.Response) != `{"id":1}` || a.ParkReason == "" ||
		a.Operator == nil || a.Operator.By != "carol" {
		t.Fatalf("resolved %+v", a)
	}
	res, err := c.Do(ctx, key, req, call)
	if err != nil || !res.Replayed || res.Via != "operator" || string(res.Response) != `{"id":1}` {
		t.Fatalf("Do after resolve: %+v, %v", res, err)
	}
	if n := b.p.charges(key); n != 1 {
		t.Fatalf("charged %d, want 1", n)
	}
	if _, err := b.admin.Resolve(ctx, sideeffect.Resolution{Name: c.Name(), Key: "nope", As: sideeffect.ResolveFailed, By: "x", Reason: "y"}); !errors.Is(err, sideeffect.ErrNotFound) {
		t.Fatalf("resolve a missing attempt: %v", err)
	}
}

// Reconcile runs in the background until its context ends, resolving
// unknown attempts as they fall due.
func TestReconcileLoop(t *testing.T) {
	b := setup(t, sideeffect.Queryable)
	ctx := context.Background()
	c := b.caller(t, func(cfg *sideeffect.Config) {
		cfg.CheckInterval, cfg.ReconcilePoll = 10*time.Millisecond, 10*time.Millisecond
	})
	call, req := b.p.call(1)
	keys := []string{uuid.NewString(), uuid.NewString()}
	for _, k := range keys {
		b.p.inject(faultDropAfterCommit)
		if _, err := c.Do(ctx, k, req, call); !errors.Is(err, sideeffect.ErrUnknown) {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Reconcile(rctx) }()
	outboxtest.Eventually(t, 30*time.Second, "the reconciler resolves both attempts", func() bool {
		g, err := b.admin.Gauges(ctx)
		return err == nil && len(g) == 1 && g[0].Unknown == 0 && g[0].Started == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Reconcile returned %v, want nil when its context ends", err)
	}
	for _, k := range keys {
		if a := b.attempt(t, k); a.State != sideeffect.Succeeded || a.Via != "lookup" {
			t.Fatalf("%+v", a)
		}
	}
}

// Without a lookup the reconciler cannot ask: a crashed caller's attempt
// becomes unknown (mode idempotent: the next Do calls again with the same
// key) or is parked at once (mode neither without BlindRetry).
func TestReconcilerWithoutLookup(t *testing.T) {
	for _, c := range []struct {
		mode sideeffect.Mode
		want sideeffect.State
	}{{sideeffect.Idempotent, sideeffect.Unknown}, {sideeffect.Neither, sideeffect.Parked}} {
		t.Run(c.mode.String(), func(t *testing.T) {
			b := setup(t, c.mode)
			ctx := context.Background()
			caller := b.caller(t, nil)
			key := uuid.NewString()
			call, req := b.p.call(3)
			func() {
				defer func() { _ = recover() }()
				caller.Do(ctx, key, req, func(ctx context.Context, k string) ([]byte, error) { //nolint:errcheck
					if _, err := call(ctx, k); err != nil {
						t.Error(err)
					}
					panic("crash")
				})
			}()
			b.expire(t, key)
			rep, err := caller.ReconcileOnce(ctx)
			if err != nil || rep.Checked != 1 {
				t.Fatalf("reconcile: %+v, %v", rep, err)
			}
			a := b.attempt(t, key)
			if a.State != c.want || a.Checks != 0 || a.UnknownSince == nil {
				t.Fatalf("after reconcile: %+v, want %s", a, c.want)
			}
			if c.want == sideeffect.Unknown {
				if rep.Unresolved != 1 || a.NextCheck == nil || a.NextCheck.Before(time.Now().Add(time.Hour)) {
					t.Fatalf("report %+v, next check %v: want the next look at the bound (MaxAge)", rep, a.NextCheck)
				}
				res, err := caller.Do(ctx, key, req, call)
				if err != nil || res.State != sideeffect.Succeeded || b.p.charges(key) != 1 {
					t.Fatalf("Do: %+v, %v, %d charges", res, err, b.p.charges(key))
				}
			}
		})
	}
}
