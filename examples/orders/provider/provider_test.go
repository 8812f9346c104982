package provider_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// bundle is one provider running in-process on its own schema.
type bundle struct {
	pool    *pgxpool.Pool
	schema  string
	svc     *provider.Service
	client  *provider.Client
	api     *httptest.Server
	crashes atomic.Int64
}

func setup(t *testing.T, mode provider.Mode, rules ...provider.Rule) *bundle {
	t.Helper()
	pool, schema := outboxtest.Schema(t)
	b := &bundle{pool: pool, schema: schema}
	svc, err := provider.New(pool, provider.Config{Schema: schema, Mode: mode, DeclineAbove: 10_000,
		Faults: provider.Faults{Seed: 1, Rules: rules},
		// In-process, a crash cannot kill the test: count it, and the
		// handler then drops the connection as a dead process would.
		Crash: func() { b.crashes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.svc = svc
	b.api = httptest.NewServer(svc.Handler())
	t.Cleanup(b.api.Close)
	ctl := httptest.NewServer(svc.ControlHandler())
	t.Cleanup(ctl.Close)
	b.client = provider.NewClient(b.api.URL, ctl.URL, &http.Client{Timeout: time.Minute})
	return b
}

func (b *bundle) ledger(t *testing.T, reference string) provider.Ledger {
	t.Helper()
	l, err := b.client.Ledger(context.Background(), reference)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// wantCharges checks the ledger's captured charges of reference.
func (b *bundle) wantCharges(t *testing.T, reference string, n int) provider.Ledger {
	t.Helper()
	l := b.ledger(t, reference)
	got := 0
	for _, e := range l.Entries {
		if e.Kind == "charge" {
			got++
		}
	}
	if got != n {
		t.Fatalf("ledger of %s has %d captured charges, want %d: %+v", reference, got, n, l.Entries)
	}
	return l
}

func wantErr(t *testing.T, err error, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Fatalf("error %v does not match %v", err, target)
		}
	}
}

var ctx = context.Background()

func eur(ref string, amount int64) provider.ChargeRequest {
	return provider.ChargeRequest{Reference: ref, Amount: amount, Currency: "eur"}
}

// TestIdempotentReplay: the same key and request returns the stored charge
// (marked replayed), for a success and for a decline; the ledger holds one
// charge.
func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent)
	first, err := b.client.Charge(ctx, "key-1", eur("order-1", 2490))
	if err != nil {
		t.Fatal(err)
	}
	if first.Replayed || first.Status != provider.ChargeSucceeded || first.IdempotencyKey != "key-1" {
		t.Fatalf("first charge: %+v", first)
	}
	again, err := b.client.Charge(ctx, "key-1", eur("order-1", 2490))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || again.ID != first.ID || !again.Created.Equal(first.Created) {
		t.Fatalf("repeat: %+v, want the replay of %+v", again, first)
	}
	b.wantCharges(t, "order-1", 1)

	d1, err := b.client.Charge(ctx, "key-2", eur("order-2", 20_000))
	wantErr(t, err, provider.ErrDeclined)
	if d1.Status != provider.ChargeDeclined || d1.FailureCode != provider.FailureAmountTooLarge || d1.ID == "" {
		t.Fatalf("declined charge: %+v", d1)
	}
	d2, err := b.client.Charge(ctx, "key-2", eur("order-2", 20_000))
	wantErr(t, err, provider.ErrDeclined)
	if !d2.Replayed || d2.ID != d1.ID {
		t.Fatalf("repeated decline: %+v, want the replay of %+v", d2, d1)
	}
	if errors.Is(err, provider.ErrAmbiguous) {
		t.Fatal("a decline is definite, not ambiguous")
	}
	if got, err := b.client.LookupByKey(ctx, "key-2"); err != nil || got.ID != d1.ID || got.Status != provider.ChargeDeclined {
		t.Fatalf("lookup of the declined key: %+v, %v", got, err)
	}
	b.wantCharges(t, "order-2", 0)
}

// TestKeyReusedWithDifferentRequest: a key reused with another amount or on
// another endpoint is refused (422) and writes nothing.
func TestKeyReusedWithDifferentRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent)
	c, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.client.Charge(ctx, "key-1", eur("order-1", 101))
	wantErr(t, err, provider.ErrKeyReused)
	_, err = b.client.Refund(ctx, "key-1", provider.RefundRequest{Charge: c.ID})
	wantErr(t, err, provider.ErrKeyReused)
	var apiErr *provider.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnprocessableEntity || apiErr.Problem == nil ||
		!strings.HasSuffix(apiErr.Problem.Type, "idempotency-key-reused") {
		t.Fatalf("refusal: %#v", err)
	}
	l := b.wantCharges(t, "order-1", 1)
	if len(l.Entries) != 1 {
		t.Fatalf("ledger: %+v", l.Entries)
	}
}

// TestConcurrentSameKey: while a request with a key is in flight, another
// with the same key gets 409 (ambiguous for the caller) and so does a
// lookup; the first, abandoned before commit, leaves nothing and the key
// free.
func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent, provider.Rule{Fault: provider.FaultLatency, Latency: provider.Duration(time.Hour), Next: 1})
	firstCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.client.Charge(firstCtx, "key-1", eur("order-1", 100))
		done <- err
	}()
	outboxtest.Eventually(t, 10*time.Second, "first request in flight", func() bool { return b.svc.InFlight() == 1 })
	_, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	wantErr(t, err, provider.ErrInProgress, provider.ErrAmbiguous)
	_, err = b.client.LookupByKey(ctx, "key-1")
	wantErr(t, err, provider.ErrInProgress)
	cancel()
	wantErr(t, <-done, provider.ErrAmbiguous)
	outboxtest.Eventually(t, 10*time.Second, "first request gone", func() bool { return b.svc.InFlight() == 0 })
	b.wantCharges(t, "order-1", 0)
	_, err = b.client.LookupByKey(ctx, "key-1")
	wantErr(t, err, provider.ErrNotFound)
	c, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	if err != nil || c.Replayed {
		t.Fatalf("retry after the abandoned request: %+v, %v", c, err)
	}
	b.wantCharges(t, "order-1", 1)
}

// TestKeyLockedByAnotherProcess: another provider process on the same
// schema (played by a transaction holding the key's advisory lock) makes a
// request with that key a 409 that changes nothing; a provider on another
// schema does not.
func TestKeyLockedByAnotherProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent)
	other := setup(t, provider.ModeIdempotent)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('provider.key.' || $2 || '.' || $1, 0))`, "key-1", b.schema); err != nil {
		t.Fatal(err)
	}
	_, err = b.client.Charge(ctx, "key-1", eur("order-1", 100))
	wantErr(t, err, provider.ErrInProgress, provider.ErrAmbiguous)
	b.wantCharges(t, "order-1", 0)
	if _, err := other.client.Charge(ctx, "key-1", eur("order-1", 100)); err != nil {
		t.Fatalf("the same key on another schema: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := b.client.Charge(ctx, "key-1", eur("order-1", 100)); err != nil || c.Replayed {
		t.Fatalf("after the lock is gone: %+v, %v", c, err)
	}
}

// TestValidation: bad requests get 400 problem+json and write nothing.
func TestValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent)
	cases := []struct {
		name, path, contentType, key, body string
	}{
		{"no reference", "/charges", "application/json", "k1", `{"amount":1,"currency":"eur"}`},
		{"zero amount", "/charges", "application/json", "k2", `{"reference":"r","amount":0,"currency":"eur"}`},
		{"upper-case currency", "/charges", "application/json", "k3", `{"reference":"r","amount":1,"currency":"EUR"}`},
		{"unknown field", "/charges", "application/json", "k4", `{"reference":"r","amount":1,"currency":"eur","card":"x"}`},
		{"two values", "/charges", "application/json", "k5", `{"reference":"r","amount":1,"currency":"eur"}{}`},
		{"not JSON", "/charges", "text/plain", "k6", `{"reference":"r","amount":1,"currency":"eur"}`},
		{"empty key", "/charges", "application/json", " ", `{"reference":"r","amount":1,"currency":"eur"}`},
		{"refund names both", "/refunds", "application/json", "k7", `{"charge":"ch_x","reference":"r"}`},
		{"refund names neither", "/refunds", "application/json", "k8", `{"amount":5}`},
		{"negative refund", "/refunds", "application/json", "k9", `{"reference":"r","amount":-1}`},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(http.MethodPost, b.api.URL+tc.path, bytes.NewBufferString(tc.body))
		req.Header.Set("Content-Type", tc.contentType)
		req.Header.Set(provider.HeaderIdempotencyKey, tc.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want 400 problem+json", tc.name, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	if l := b.ledger(t, ""); len(l.Entries) != 0 {
		t.Fatalf("ledger after refused requests: %+v", l.Entries)
	}
	// The keys were not stored: a valid request with one executes.
	if c, err := b.client.Charge(ctx, "k2", eur("r", 1)); err != nil || c.Replayed {
		t.Fatalf("valid request with a refused request's key: %+v, %v", c, err)
	}
}

// TestRefunds: partial and full refunds by charge id and by reference, a
// refund past the charge fails definitely (402, recorded), and the ledger's
// net goes to zero.
func TestRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent)
	c, err := b.client.Charge(ctx, "charge-1", eur("order-1", 1000))
	if err != nil {
		t.Fatal(err)
	}
	r1, err := b.client.Refund(ctx, "refund-1", provider.RefundRequest{Charge: c.ID, Amount: 300})
	if err != nil || r1.Amount != 300 || r1.Status != provider.RefundSucceeded || r1.Reference != "order-1" {
		t.Fatalf("partial refund: %+v, %v", r1, err)
	}
	again, err := b.client.Refund(ctx, "refund-1", provider.RefundRequest{Charge: c.ID, Amount: 300})
	if err != nil || !again.Replayed || again.ID != r1.ID {
		t.Fatalf("repeated refund: %+v, %v", again, err)
	}
	over, err := b.client.Refund(ctx, "refund-over", provider.RefundRequest{Charge: c.ID, Amount: 701})
	wantErr(t, err, provider.ErrDeclined)
	if over.Status != provider.RefundFailed || over.FailureCode != provider.FailureExceedsRefundable {
		t.Fatalf("refund of more than is left: %+v", over)
	}
	r2, err := b.client.Refund(ctx, "refund-2", provider.RefundRequest{Reference: "order-1"})
	if err != nil || r2.Amount != 700 {
		t.Fatalf("refund of the rest by reference: %+v, %v", r2, err)
	}
	r3, err := b.client.Refund(ctx, "refund-3", provider.RefundRequest{Charge: c.ID, Amount: 1})
	wantErr(t, err, provider.ErrDeclined)
	if r3.Status != provider.RefundFailed || r3.FailureCode != provider.FailureExceedsRefundable {
		t.Fatalf("refund past the charge: %+v", r3)
	}
	if got, err := b.client.LookupRefundByKey(ctx, "refund-2"); err != nil || got.ID != r2.ID {
		t.Fatalf("refund lookup: %+v, %v", got, err)
	}
	_, err = b.client.Refund(ctx, "refund-4", provider.RefundRequest{Reference: "no-such-order"})
	wantErr(t, err, provider.ErrNotFound)
	l := b.ledger(t, "order-1")
	if len(l.Totals) != 1 || l.Totals[0] != (provider.LedgerTotal{Reference: "order-1", Currency: "eur", Charges: 1, Captured: 1000, Refunds: 2, Refunded: 1000, Net: 0}) {
		t.Fatalf("ledger totals: %+v", l.Totals)
	}
}

// TestFaultTimeoutAfterCommit: the provider commits and never answers; the
// caller gives up (ambiguous) while the ledger has the charge, and a retry
// with the same key gets the stored charge, not a second one. The caller
// gives up once the charge is in the ledger (a time-out of its own, 500 ms,
// could end before a loaded machine's provider committed).
func TestFaultTimeoutAfterCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent, provider.Rule{Fault: provider.FaultTimeoutAfterCommit, Next: 1})
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	charged := make(chan error, 1)
	go func() {
		_, err := b.client.Charge(tctx, "key-1", eur("order-1", 100))
		charged <- err
	}()
	// The fault is drawn for the charge (no other request is made before
	// that), then the charge commits; the caller then gives up.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if b.svc.FaultStatus().Injected[provider.FaultTimeoutAfterCommit] == 1 && len(b.ledger(t, "order-1").Entries) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no charge in the ledger a minute into the hanging request: %+v", b.svc.FaultStatus())
		}
	}
	select {
	case err := <-charged:
		t.Fatalf("the charge returned while the provider hangs: %v", err)
	default:
	}
	cancel()
	err := <-charged
	wantErr(t, err, provider.ErrAmbiguous)
	l := b.wantCharges(t, "order-1", 1)
	got, err := b.client.LookupByKey(ctx, "key-1")
	if err != nil || got.ID != l.Entries[0].ID {
		t.Fatalf("lookup after the timeout: %+v, %v", got, err)
	}
	retry, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	if err != nil || !retry.Replayed || retry.ID != got.ID {
		t.Fatalf("retry: %+v, %v", retry, err)
	}
	b.wantCharges(t, "order-1", 1)
	if st := b.svc.FaultStatus(); st.Injected[provider.FaultTimeoutAfterCommit] != 1 {
		t.Fatalf("fault status: %+v", st)
	}
}

// TestFaultsAfterCommit: a dropped response, a 500 after commit and a crash
// (in-process: the connection dies) each leave the charge in the ledger
// while the caller sees an ambiguous error; the retry replays it.
func TestFaultsAfterCommit(t *testing.T) {
	t.Parallel()
	for _, kind := range []provider.FaultKind{provider.FaultDropResponse, provider.FaultErrorAfterCommit, provider.FaultCrash} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, provider.ModeIdempotent, provider.Rule{Fault: kind, Next: 1})
			_, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
			wantErr(t, err, provider.ErrAmbiguous)
			b.wantCharges(t, "order-1", 1)
			retry, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
			if err != nil || !retry.Replayed {
				t.Fatalf("retry: %+v, %v", retry, err)
			}
			b.wantCharges(t, "order-1", 1)
			if kind == provider.FaultCrash && b.crashes.Load() != 1 {
				t.Fatalf("crashes: %d, want 1", b.crashes.Load())
			}
		})
	}
}

// TestFaultErrorBeforeCommit: a 500 before commit is ambiguous to the
// caller, but nothing was written: the lookup finds nothing and the retry
// executes afresh.
func TestFaultErrorBeforeCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent, provider.Rule{Fault: provider.FaultErrorBeforeCommit, Next: 1})
	_, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	wantErr(t, err, provider.ErrAmbiguous)
	b.wantCharges(t, "order-1", 0)
	_, err = b.client.LookupByKey(ctx, "key-1")
	wantErr(t, err, provider.ErrNotFound)
	retry, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	if err != nil || retry.Replayed {
		t.Fatalf("retry: %+v, %v", retry, err)
	}
	b.wantCharges(t, "order-1", 1)
}

// TestFaultLatency: an injected latency delays the request by at least its
// amount and is counted.
func TestFaultLatency(t *testing.T) {
	t.Parallel()
	const latency = 200 * time.Millisecond
	b := setup(t, provider.ModeIdempotent, provider.Rule{Fault: provider.FaultLatency, Latency: provider.Duration(latency), On: "charges"})
	start := time.Now()
	if _, err := b.client.Charge(ctx, "key-1", eur("order-1", 100)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < latency {
		t.Fatalf("charge took %v, less than the injected %v", took, latency)
	}
	if st := b.svc.FaultStatus(); st.Injected[provider.FaultLatency] != 1 || st.Rules[0].Fired != 1 {
		t.Fatalf("fault status: %+v", st)
	}
}

// TestControlFaults: faults set through the control API apply to the next
// requests and are counted; a bad rule is refused.
func TestControlFaults(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeIdempotent)
	st, err := b.client.SetFaults(ctx, provider.Faults{Seed: 42, Rules: []provider.Rule{{Fault: provider.FaultDropResponse, After: 1, Next: 1}}})
	if err != nil || st.Seed != 42 || len(st.Rules) != 1 {
		t.Fatalf("set faults: %+v, %v", st, err)
	}
	if _, err := b.client.Charge(ctx, "key-1", eur("order-1", 100)); err != nil {
		t.Fatalf("first charge (skipped by after=1): %v", err)
	}
	_, err = b.client.Charge(ctx, "key-2", eur("order-2", 100))
	wantErr(t, err, provider.ErrAmbiguous)
	if _, err := b.client.Charge(ctx, "key-3", eur("order-3", 100)); err != nil {
		t.Fatalf("third charge (next=1 spent): %v", err)
	}
	st, err = b.client.Faults(ctx)
	if err != nil || st.Rules[0].Matched != 3 || st.Rules[0].Fired != 1 || st.Injected[provider.FaultDropResponse] != 1 {
		t.Fatalf("fault status: %+v, %v", st, err)
	}
	_, err = b.client.SetFaults(ctx, provider.Faults{Rules: []provider.Rule{{Fault: "meteor"}}})
	wantErr(t, err, provider.ErrInvalid)
	// The API listener does not serve the control API.
	resp, err := http.Post(b.api.URL+"/control/faults", "application/json", strings.NewReader(`{"rules":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /control/faults on the API listener: %d", resp.StatusCode)
	}
}

// TestQueryableMode: keys are ignored (a repeat charges again), there is
// no lookup by key, and a caller that lost a response finds the charge by
// reference instead of retrying.
func TestQueryableMode(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeQueryable, provider.Rule{Fault: provider.FaultDropResponse, Next: 1})
	_, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	wantErr(t, err, provider.ErrAmbiguous)
	found, err := b.client.LookupByReference(ctx, "order-1")
	if err != nil || len(found) != 1 || found[0].Status != provider.ChargeSucceeded {
		t.Fatalf("lookup by reference: %+v, %v", found, err)
	}
	none, err := b.client.LookupByReference(ctx, "order-2")
	if err != nil || len(none) != 0 || none == nil {
		t.Fatalf("lookup of an unknown reference: %#v, %v", none, err)
	}
	_, err = b.client.LookupByKey(ctx, "key-1")
	wantErr(t, err, provider.ErrLookupUnsupported)
	r, err := b.client.Refund(ctx, "", provider.RefundRequest{Charge: found[0].ID, Amount: 40})
	if err != nil {
		t.Fatal(err)
	}
	if rs, err := b.client.LookupRefundsByReference(ctx, "order-1"); err != nil || len(rs) != 1 || rs[0].ID != r.ID {
		t.Fatalf("refunds by reference: %+v, %v", rs, err)
	}
	// The key is not honoured: a blind retry is a second charge.
	retry, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	if err != nil || retry.Replayed || retry.ID == found[0].ID {
		t.Fatalf("repeat in queryable mode: %+v, %v", retry, err)
	}
	if l := b.wantCharges(t, "order-1", 2); l.Duplicates != 1 || l.Totals[0].Net != 160 {
		t.Fatalf("ledger: %+v", l)
	}
}

// TestNeitherMode: no lookup at all, and a retry after a lost response
// charges twice: the duplicate is in the ledger (the measured risk).
func TestNeitherMode(t *testing.T) {
	t.Parallel()
	b := setup(t, provider.ModeNeither, provider.Rule{Fault: provider.FaultDropResponse, Next: 1})
	_, err := b.client.Charge(ctx, "key-1", eur("order-1", 100))
	wantErr(t, err, provider.ErrAmbiguous)
	_, err = b.client.LookupByKey(ctx, "key-1")
	wantErr(t, err, provider.ErrLookupUnsupported)
	_, err = b.client.LookupByReference(ctx, "order-1")
	wantErr(t, err, provider.ErrLookupUnsupported)
	if _, err := b.client.Charge(ctx, "key-1", eur("order-1", 100)); err != nil {
		t.Fatal(err)
	}
	l := b.wantCharges(t, "order-1", 2)
	if l.Duplicates != 1 || l.Totals[0].Net != 200 || l.Entries[0].IdempotencyKey != "key-1" || l.Entries[1].IdempotencyKey != "key-1" {
		t.Fatalf("ledger: %+v", l)
	}
}
