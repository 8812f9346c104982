package saga_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/examples/orders/payments"
	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/examples/orders/saga"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
	"github.com/pgoutbox/outbox/sideeffect"
)

const waitFor = 30 * time.Second

// declineAbove: an order above 1000.00 eur is declined by the provider.
const declineAbove = 100_000

type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	schema   string
	api      *ordersapi.Service
	prov     *provider.Service
	client   *provider.Client
	payments *payments.Consumer
	// refundLookupsDown makes the provider answer 503 to refund lookups
	// (GET /refunds), injected in front of it.
	refundLookupsDown atomic.Bool
}

// newEnv runs the whole saga in-process on a schema and a stream of the
// test's own: the order service, a relay to NATS JetStream, inventory (with
// its saga events), payments (against a provider in mode), the saga
// consumer and the provider.
func newEnv(t *testing.T, mode provider.Mode) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	_, schema := outboxtest.Schema(t)
	// A pool of its own, large enough for payments (payments.PoolSize).
	pcfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var w io.Writer = io.Discard
	if testing.Verbose() && os.Getenv("SAGA_TEST_LOG") != "" {
		w = os.Stderr
	}
	log := slog.New(slog.NewTextHandler(w, nil))
	api, err := ordersapi.New(pool, ordersapi.Config{Schema: schema, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := inventory.Migrate(ctx, pool, schema, ""); err != nil {
		t.Fatal(err)
	}
	if err := payments.Migrate(ctx, pool, schema, ""); err != nil {
		t.Fatal(err)
	}
	prov, err := provider.New(pool, provider.Config{Schema: schema, Mode: mode, DeclineAbove: declineAbove, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := prov.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, pool: pool, schema: schema, api: api, prov: prov}
	h := prov.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/refunds" && e.refundLookupsDown.Load() {
			http.Error(w, "refund lookups are down", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(prov.StopHanging)
	client := provider.NewClient(srv.URL, "", payments.HTTPClient())

	nc, err := nats.Connect(outboxtest.NATSURL())
	if err != nil {
		t.Fatalf("NATS is not reachable at %s: %v", outboxtest.NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := outboxtest.UniqueName(t, "saga")
	stream, prefix := strings.ToUpper(name), name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", stream, err)
		}
	})
	pub, err := outboxnats.NewPublisher(ctx, js, outboxnats.Config{Stream: stream, SubjectPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 20 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.New(pool, inventory.Config{Settings: inventory.Settings{Schema: schema, Stream: stream, SubjectPrefix: prefix,
		AckWait: 10 * time.Second, RetryDelay: 50 * time.Millisecond, Logger: log}, EarlyDelay: 20 * time.Millisecond, SagaEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	pay, err := payments.New(pool, payments.Config{Settings: payments.Settings{Schema: schema, Stream: stream, SubjectPrefix: prefix,
		AckWait: 20 * time.Second, RetryDelay: 20 * time.Millisecond, Logger: log}, Provider: client, Mode: mode,
		CallTimeout: 2 * time.Second, CheckInterval: 50 * time.Millisecond, MaxCheckInterval: 500 * time.Millisecond,
		MaxChecks: 1000, RefundAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	sg, err := saga.New(pool, api, saga.Config{Settings: saga.Settings{Schema: schema, Stream: stream, SubjectPrefix: prefix,
		AckWait: 10 * time.Second, RetryDelay: 20 * time.Millisecond, Logger: log}})
	if err != nil {
		t.Fatal(err)
	}
	runs := []func(context.Context) error{
		relay.Run,
		func(ctx context.Context) error { return inv.RunNATS(ctx, js) },
		func(ctx context.Context) error { return pay.Run(ctx, js) },
		func(ctx context.Context) error { return sg.Run(ctx, js) },
	}
	done := make(chan error, len(runs))
	for _, run := range runs {
		go func() { done <- run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for range runs {
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Error("a part did not stop after its context ended")
				return
			}
		}
	})
	e.client, e.payments = client, pay
	return e
}

func (e *env) order(t *testing.T, items ...ordersapi.Item) ordersapi.Order {
	t.Helper()
	o, _, err := e.api.Create(context.Background(), "", ordersapi.CreateRequest{CustomerID: "c-saga", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// waitSaga waits until the order's saga is in state and returns the order.
func (e *env) waitSaga(t *testing.T, id, state string) ordersapi.Order {
	t.Helper()
	var o ordersapi.Order
	outboxtest.Eventually(t, waitFor, "saga of order "+id+" reaches "+state, func() bool {
		var err error
		o, err = e.api.Get(context.Background(), id)
		return err == nil && o.Saga != nil && o.Saga.State == state
	})
	return o
}

// ledger is the provider's ledger total of the order's charge reference.
func (e *env) ledger(t *testing.T, id string) provider.LedgerTotal {
	t.Helper()
	l, err := e.client.Ledger(context.Background(), payments.ChargeKey(id))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Totals) == 0 {
		return provider.LedgerTotal{}
	}
	return l.Totals[0]
}

// reservations counts the order's inventory rows by status.
func (e *env) reservations(t *testing.T, id string) map[string]int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT status, count(*) FROM "+e.schema+".inventory_reservations WHERE order_id = $1 GROUP BY status", id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

func steps(o ordersapi.Order) string {
	var b []string
	for _, s := range o.Saga.Steps {
		b = append(b, s.Step+"→"+s.State)
	}
	return strings.Join(b, ", ")
}

func hasStep(o ordersapi.Order, step string) bool {
	for _, s := range o.Saga.Steps {
		if s.Step == step {
			return true
		}
	}
	return false
}

func TestSaga(t *testing.T) {
	for _, mode := range []provider.Mode{provider.ModeIdempotent, provider.ModeQueryable} {
		t.Run(string(mode), func(t *testing.T) { testSaga(t, mode) })
	}
}

func testSaga(t *testing.T, mode provider.Mode) {
	e := newEnv(t, mode)
	ctx := context.Background()

	t.Run("confirm", func(t *testing.T) {
		o := e.order(t, ordersapi.Item{SKU: "SKU-1001", Quantity: 2})
		o = e.waitSaga(t, o.ID, ordersapi.SagaConfirmed)
		if o.Status != ordersapi.StatusConfirmed || o.TotalCents != 2*2490 {
			t.Errorf("order %s: status %s total %d, want confirmed 4980", o.ID, o.Status, o.TotalCents)
		}
		if l := e.ledger(t, o.ID); l.Charges != 1 || l.Net != 2*2490 {
			t.Errorf("ledger %+v, want one charge of 4980", l)
		}
		if r := e.reservations(t, o.ID); r["reserved"] != 1 {
			t.Errorf("reservations %v, want 1 reserved", r)
		}
		t.Logf("steps: %s", steps(o))
	})

	t.Run("stock rejected", func(t *testing.T) {
		if _, err := e.pool.Exec(ctx, "INSERT INTO "+e.schema+".inventory_stock (sku, on_hand) VALUES ('SKU-1008', 1)"); err != nil {
			t.Fatal(err)
		}
		o := e.order(t, ordersapi.Item{SKU: "SKU-1001", Quantity: 1}, ordersapi.Item{SKU: "SKU-1008", Quantity: 2})
		o = e.waitSaga(t, o.ID, ordersapi.SagaCancelled)
		if o.Status != ordersapi.StatusCancelled || !strings.HasPrefix(o.CancelReason, "stock rejected: SKU-1008") {
			t.Errorf("order %s: status %s reason %q, want cancelled for SKU-1008's stock", o.ID, o.Status, o.CancelReason)
		}
		if r := e.reservations(t, o.ID); r["rejected"] != 2 || r["reserved"] != 0 {
			t.Errorf("reservations %v, want 2 rejected", r)
		}
		// Nothing was charged, ever: wait for payments to have seen both
		// events, then look at the ledger.
		waitPayment(t, e, o.ID, "cancelled_before_charge")
		if l := e.ledger(t, o.ID); l.Charges != 0 {
			t.Errorf("ledger %+v, want no charge", l)
		}
	})

	t.Run("payment declined", func(t *testing.T) {
		o := e.order(t, ordersapi.Item{SKU: "SKU-1003", Quantity: 20}) // 1180.00 eur
		o = e.waitSaga(t, o.ID, ordersapi.SagaCancelled)
		if !strings.HasPrefix(o.CancelReason, "payment failed: declined") {
			t.Errorf("reason %q, want payment failed: declined", o.CancelReason)
		}
		outboxtest.Eventually(t, waitFor, "stock of the declined order released", func() bool {
			r := e.reservations(t, o.ID)
			return r["released"] == 1 && r["reserved"] == 0
		})
		if l := e.ledger(t, o.ID); l.Charges != 0 {
			t.Errorf("ledger %+v, want no capture", l)
		}
	})

	t.Run("cancel after capture refunds", func(t *testing.T) {
		o := e.order(t, ordersapi.Item{SKU: "SKU-1005", Quantity: 1})
		e.waitSaga(t, o.ID, ordersapi.SagaConfirmed)
		if _, err := e.api.Cancel(ctx, o.ID); err != nil {
			t.Fatal(err)
		}
		outboxtest.Eventually(t, waitFor, "charge refunded", func() bool {
			l := e.ledger(t, o.ID)
			return l.Charges == 1 && l.Refunds == 1 && l.Net == 0
		})
		outboxtest.Eventually(t, waitFor, "stock released and refund in the history", func() bool {
			o, _ = e.api.Get(ctx, o.ID)
			return e.reservations(t, o.ID)["released"] == 1 && hasStep(o, orderevents.PaymentRefunded)
		})
		if o.Saga.State != ordersapi.SagaCancelled || o.CancelReason != ordersapi.ReasonCustomer {
			t.Errorf("saga %s, reason %q; want cancelled by the customer", o.Saga.State, o.CancelReason)
		}
	})

	// Issue 19, item 13: the refund's call times out after the provider
	// refunded, and the lookups that would tell fail too, past the
	// cancellation's RefundAttempts deliveries. The saga is parked with
	// the refund's outcome unknown, never "refund failed"; once a lookup
	// learns the refund happened, the saga ends cancelled with its
	// compensation done. Before the fix payments recorded RefundFailed at
	// the last delivery and the saga stayed needs_attention with "refund
	// failed" for a refund that had succeeded.
	t.Run("refund outcome unknown past the attempts, then learnt", func(t *testing.T) {
		o := e.order(t, ordersapi.Item{SKU: "SKU-1007", Quantity: 1})
		e.waitSaga(t, o.ID, ordersapi.SagaConfirmed)
		e.refundLookupsDown.Store(true)
		defer e.refundLookupsDown.Store(false)
		if err := e.prov.SetFaults(provider.Faults{Rules: []provider.Rule{{Fault: provider.FaultTimeoutAfterCommit, On: "refunds", Next: 1}}}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = e.prov.SetFaults(provider.Faults{}) }()
		if _, err := e.api.Cancel(ctx, o.ID); err != nil {
			t.Fatal(err)
		}
		o = e.waitSaga(t, o.ID, ordersapi.SagaNeedsAttention)
		if !strings.HasPrefix(o.Saga.Reason, "refund outcome unknown: outcome still unknown after 3 attempts") || hasStep(o, orderevents.RefundFailed) {
			t.Fatalf("saga parked with reason %q (steps %s); want the refund's outcome unknown, never failed", o.Saga.Reason, steps(o))
		}
		if l := e.ledger(t, o.ID); l.Refunds != 1 || l.Net != 0 {
			t.Fatalf("ledger %+v: the provider refunded on the first call", l)
		}
		e.refundLookupsDown.Store(false) // the reconciler's next lookup finds the refund
		o = e.waitSaga(t, o.ID, ordersapi.SagaCancelled)
		if hasStep(o, orderevents.RefundFailed) || !hasStep(o, orderevents.RefundUnknown) || !hasStep(o, orderevents.PaymentRefunded) {
			t.Errorf("steps %s: want RefundUnknown then PaymentRefunded, no RefundFailed", steps(o))
		}
		outboxtest.Eventually(t, waitFor, "stock released", func() bool { return e.reservations(t, o.ID)["released"] == 1 })
		waitPayment(t, e, o.ID, "refunded")
		if l := e.ledger(t, o.ID); l.Charges != 1 || l.Refunds != 1 || l.Net != 0 {
			t.Errorf("ledger %+v, want one charge and its refund", l)
		}
	})

	t.Run("refund fails, saga parked, operator resolves", func(t *testing.T) {
		o := e.order(t, ordersapi.Item{SKU: "SKU-1006", Quantity: 1})
		e.waitSaga(t, o.ID, ordersapi.SagaConfirmed)
		if err := e.prov.SetFaults(provider.Faults{Rules: []provider.Rule{{Fault: provider.FaultErrorBeforeCommit, On: "refunds"}}}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = e.prov.SetFaults(provider.Faults{}) }()
		if _, err := e.api.Cancel(ctx, o.ID); err != nil {
			t.Fatal(err)
		}
		// Each refund answers 500: its outcome is unknown (the provider
		// may have refunded), so the saga waits, parked.
		o = e.waitSaga(t, o.ID, ordersapi.SagaNeedsAttention)
		if !strings.HasPrefix(o.Saga.Reason, "refund outcome unknown: outcome still unknown after 3 attempts") {
			t.Errorf("saga reason %q", o.Saga.Reason)
		}
		// The operator learns from the provider that nothing was refunded
		// and settles the call as failed; payments then records
		// RefundFailed.
		admin, err := sideeffect.NewAdmin(e.pool, sideeffect.AdminConfig{Schema: e.schema})
		if err != nil {
			t.Fatal(err)
		}
		outboxtest.Eventually(t, waitFor, "the refund's call resolved as failed", func() bool {
			_, err := admin.Resolve(ctx, sideeffect.Resolution{Name: payments.RefundName,
				Key: payments.RefundKey(o.ID), As: sideeffect.ResolveFailed, By: "alice", Reason: "no refund at the provider; refunding by transfer"})
			return err == nil
		})
		outboxtest.Eventually(t, waitFor, "the saga says the refund failed", func() bool {
			o, _ = e.api.Get(ctx, o.ID)
			return o.Saga != nil && o.Saga.State == ordersapi.SagaNeedsAttention && strings.HasPrefix(o.Saga.Reason, "refund failed: an operator resolved")
		})
		if l := e.ledger(t, o.ID); l.Net != 2990 {
			t.Errorf("ledger %+v: the refund must not have happened", l)
		}
		counts, err := e.api.SagaCounts(ctx)
		if err != nil || counts[ordersapi.SagaNeedsAttention] != 1 {
			t.Errorf("saga counts %v (%v), want one needing attention", counts, err)
		}
		if n := gauge(t, e.api, "orders_sagas", ordersapi.SagaNeedsAttention); n != 1 {
			t.Errorf("orders_sagas{state=needs_attention} = %v, want 1", n)
		}
		if n := gauge(t, e.api, "orders_saga_needs_attention_oldest_seconds", ""); n <= 0 {
			t.Errorf("orders_saga_needs_attention_oldest_seconds = %v, want > 0", n)
		}
		if _, err := e.api.ResolveSaga(ctx, o.ID, ordersapi.SagaConfirmed, "", "ops"); err == nil {
			t.Error("resolve without a reason succeeded")
		}
		sg, err := e.api.ResolveSaga(ctx, o.ID, ordersapi.SagaCancelled, "refunded by hand, ticket 42", "alice")
		if err != nil {
			t.Fatal(err)
		}
		last := sg.Steps[len(sg.Steps)-1]
		if sg.State != ordersapi.SagaCancelled || last.Actor != "alice" || last.Reason != "refunded by hand, ticket 42" {
			t.Errorf("after resolve: state %s, last step %+v", sg.State, last)
		}
		if _, err := e.api.ResolveSaga(ctx, o.ID, ordersapi.SagaCancelled, "again", "alice"); !errors.Is(err, ordersapi.ErrNotNeedingAttention) {
			t.Errorf("second resolve: %v, want ErrNotNeedingAttention", err)
		}
	})
	if st := e.payments.Stats(); st.Captured < 3 {
		t.Errorf("payments stats %+v", st)
	}
}

func waitPayment(t *testing.T, e *env, orderID, status string) {
	t.Helper()
	outboxtest.Eventually(t, waitFor, fmt.Sprintf("payments row of %s is %s", orderID, status), func() bool {
		var got string
		var cancelled bool
		err := e.pool.QueryRow(context.Background(), "SELECT status, cancelled FROM "+e.schema+".payments WHERE order_id = $1", orderID).Scan(&got, &cancelled)
		return err == nil && got == status && cancelled
	})
}

// gauge reads a gauge of saga.Collector (the sample with label state, or
// the only one when state is "").
func gauge(t *testing.T, svc *ordersapi.Service, name, state string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(saga.Collector(svc))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if state == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == state) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{state=%q}", name, state)
	return 0
}
