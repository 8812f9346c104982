package payments_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/payments"
	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/sideeffect"
)

// env is a payments consumer's schema and the example's payment provider
// (an HTTP server with its ledger) on it.
type env struct {
	schema string
	pool   *pgxpool.Pool
	client *provider.Client
	svc    *provider.Service
	posts  atomic.Int64 // POST /charges received
}

func newEnv(t *testing.T, mode provider.Mode) *env {
	t.Helper()
	ctx := context.Background()
	_, schema := outboxtest.Schema(t)
	e := &env{schema: schema, pool: newPool(t, "")}
	if err := payments.Migrate(ctx, e.pool, schema, ""); err != nil {
		t.Fatal(err)
	}
	svc, err := provider.New(e.pool, provider.Config{Schema: schema, Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	h := svc.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/charges" {
			e.posts.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(svc.StopHanging)
	e.svc = svc
	e.client = provider.NewClient(srv.URL, "", payments.HTTPClient())
	return e
}

// newPool opens a pool big enough for a payments consumer with one worker;
// idleInTx, when set, is the sessions' idle_in_transaction_session_timeout.
func newPool(t *testing.T, idleInTx string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = payments.PoolSize(1)
	if idleInTx != "" {
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = idleInTx
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (e *env) consumer(t *testing.T, pool *pgxpool.Pool, mode provider.Mode) *payments.Consumer {
	t.Helper()
	c, err := payments.New(pool, payments.Config{
		Settings: payments.Settings{Schema: e.schema, Workers: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Provider: e.client, Mode: mode, BlindRetry: mode == provider.ModeNeither,
		CallTimeout: time.Second, // the helper's lease: 3s
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) charges(t *testing.T, reference string) int {
	t.Helper()
	l, err := e.client.Ledger(context.Background(), reference)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, en := range l.Entries {
		if en.Kind == "charge" {
			n++
		}
	}
	return n
}

func stockReserved(t *testing.T, orderID string, cents int64) outbox.Message {
	t.Helper()
	b, err := json.Marshal(orderevents.StockPayload{OrderID: orderID, TotalCents: cents})
	if err != nil {
		t.Fatal(err)
	}
	return outbox.Message{ID: uuid.New(), AggregateType: orderevents.InventoryAggregateType, AggregateID: orderID,
		Sequence: 1, Type: orderevents.StockReserved, SchemaVersion: 1, Payload: b, OccurredAt: time.Now()}
}

// Issue 19, item 3, the saga's payments step: a payments worker is paused
// (failpoint sideeffect/before-call) after claiming the charge and before
// calling the provider, long enough for its inbox transaction to be ended
// by the server (idle_in_transaction_session_timeout, as a frozen VM's
// connection would be) and for its claim's lease to run out. The
// StockReserved's redelivery, on another consumer, charges the order. When
// the paused worker wakes it must not charge too: before the fix it did,
// and the provider's ledger showed two charges in modes queryable and
// neither (idempotent: two requests, deduplicated by the provider). Not
// parallel: failpoints are process-wide.
func TestPausedPaymentsWorkerChargesOnce(t *testing.T) {
	for _, mode := range []provider.Mode{provider.ModeIdempotent, provider.ModeQueryable, provider.ModeNeither} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, mode)
			paused := e.consumer(t, newPool(t, "1s"), mode)
			other := e.consumer(t, newPool(t, ""), mode)
			admin, err := sideeffect.NewAdmin(e.pool, sideeffect.AdminConfig{Schema: e.schema})
			if err != nil {
				t.Fatal(err)
			}
			orderID := uuid.NewString()
			msg := stockReserved(t, orderID, 4980)

			if err := failpoint.Enable(sideeffect.FailpointBeforeCall+"=sleep(6s)@1", 1); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = failpoint.Enable("", 0) })
			first := make(chan error, 1)
			go func() {
				_, err := paused.Handle(ctx, msg, 1)
				first <- err
			}()
			outboxtest.Eventually(t, 30*time.Second, "the paused worker's claim expires", func() bool {
				a, err := admin.Attempt(ctx, payments.ChargeName, payments.ChargeKey(orderID))
				return err == nil && a.Expired
			})
			// The redelivery (JetStream's, after AckWait) on another
			// consumer; its inbox transaction waits until the paused one's
			// has been ended by the server.
			if _, err := other.Handle(ctx, msg, 2); err != nil {
				t.Fatalf("the redelivery: %v", err)
			}
			select {
			case err := <-first:
				if err == nil {
					t.Error("the paused worker's delivery settled; want an error (it must not have charged)")
				}
				t.Logf("the paused worker: %v", err)
			case <-time.After(60 * time.Second):
				t.Fatal("the paused worker did not return")
			}
			if n := e.posts.Load(); n != 1 {
				t.Errorf("the provider got %d charge requests, want 1", n)
			}
			if n := e.charges(t, payments.ChargeKey(orderID)); n != 1 {
				t.Errorf("the provider's ledger shows %d charges of order %s, want 1", n, orderID)
			}
			var status string
			if err := e.pool.QueryRow(ctx, "SELECT status FROM "+e.schema+".payments WHERE order_id = $1", orderID).Scan(&status); err != nil || status != "captured" {
				t.Errorf("payments row: %q, %v; want captured", status, err)
			}
		})
	}
}
