package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/payments"
	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
	"github.com/pgoutbox/outbox/sideeffect"
)

// warnings counts the log records at warning level or above, and keeps
// their messages.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := r.Message
	r.Attrs(func(a slog.Attr) bool { m += " " + a.String(); return true })
	w.msgs = append(w.msgs, m)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }
func (w *warnings) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// Issue 22, item 6: a charge the side-effect helper parks for an operator
// (mode neither, no blind retry, an ambiguous answer) was redelivered every
// 10 s with a warning until an operator resolved it (5,835 warnings in 27
// minutes in the demo). Now the StockReserved is applied as charge_parked,
// waiting on the attempt (sideeffect.Caller.WaitTx), and acknowledged:
// JetStream holds nothing for a redelivery, further deliveries (lost acks)
// are duplicates that log nothing, and the charge is made or recorded once
// after the operator's resolution, which wakes the helper's Resume.
func TestParkedChargeWaitsForItsResolutionWithoutRedelivery(t *testing.T) {
	for _, c := range []struct {
		name  string
		fault provider.FaultKind
		as    sideeffect.ResolveAs
		// posts is how many charge requests the provider gets in all.
		posts int64
	}{
		// The provider charged, then answered 500: the operator checks and
		// resolves the call as succeeded; nothing is called again.
		{"resolved succeeded", provider.FaultErrorAfterCommit, sideeffect.ResolveSucceeded, 1},
		// The provider answered 500 before charging: the operator lets the
		// next call go; the resolver charges with the same key.
		{"resolved retry", provider.FaultErrorBeforeCommit, sideeffect.ResolveRetry, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e := newEnv(t, provider.ModeNeither)
			if err := e.svc.SetFaults(provider.Faults{Rules: []provider.Rule{{Fault: c.fault, On: "charges", Next: 1}}}); err != nil {
				t.Fatal(err)
			}
			js := natstest.JetStream(t, natstest.Conn(t))
			name := outboxtest.UniqueName(t, "parked")
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
			warn := &warnings{}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("warnings: %q", warn.list())
				}
			})
			cons, err := payments.New(e.pool, payments.Config{
				Settings: payments.Settings{Schema: e.schema, Stream: stream, SubjectPrefix: prefix, Workers: 1,
					AckWait: 10 * time.Second, RetryDelay: 20 * time.Millisecond, Logger: slog.New(warn)},
				Provider: e.client, Mode: provider.ModeNeither, CallTimeout: time.Second,
				CheckInterval: 50 * time.Millisecond, MaxCheckInterval: 200 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cons.Run(ctx, js) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			})

			orderID := uuid.NewString()
			msg := stockReserved(t, orderID, 2990)
			for _, err := range pub.Publish(ctx, []outbox.Message{msg}) {
				if err != nil {
					t.Fatal(err)
				}
			}
			admin, err := sideeffect.NewAdmin(e.pool, sideeffect.AdminConfig{Schema: e.schema})
			if err != nil {
				t.Fatal(err)
			}
			outboxtest.Eventually(t, 30*time.Second, "the charge parked and the StockReserved applied", func() bool {
				return status(t, e, orderID) == "charge_parked"
			})
			a, err := admin.Attempt(ctx, payments.ChargeName, payments.ChargeKey(orderID))
			if err != nil || a.State != sideeffect.Parked {
				t.Fatalf("the charge's attempt: %+v, %v; want parked", a, err)
			}
			// Acknowledged: JetStream has nothing left to redeliver.
			jc, err := js.Consumer(ctx, stream, payments.DurableDefault+"-"+orderevents.InventoryAggregateType)
			if err != nil {
				t.Fatal(err)
			}
			outboxtest.Eventually(t, 30*time.Second, "the StockReserved acknowledged", func() bool {
				info, err := jc.Info(ctx)
				return err == nil && info.NumAckPending == 0 && info.NumPending == 0
			})
			// Many more deliveries (lost acks, a replay): each a duplicate,
			// settled without a call and without a line.
			before := warn.list()
			for d := 3; d < 53; d++ {
				if _, err := cons.Handle(ctx, msg, d); err != nil {
					t.Fatalf("delivery %d: %v", d, err)
				}
			}
			if after := warn.list(); len(after) != len(before) {
				t.Errorf("50 deliveries of the parked charge's event logged %d warnings: %q", len(after)-len(before), after[len(before):])
			}
			// The first delivery's unknown outcome and the park: a warning
			// each, and nothing per redelivery.
			if got := warn.list(); len(got) > 3 {
				t.Errorf("%d warnings for one parked charge, want at most 3: %q", len(got), got)
			}
			if n := cons.Stats().ChargesParked; n != 1 {
				t.Errorf("ChargesParked = %d, want 1", n)
			}

			var response []byte
			if c.as == sideeffect.ResolveSucceeded {
				l, err := e.client.Ledger(ctx, payments.ChargeKey(orderID))
				if err != nil || len(l.Entries) != 1 {
					t.Fatalf("ledger %+v, %v: want the one charge made before the 500", l, err)
				}
				response, _ = json.Marshal(provider.Charge{ID: l.Entries[0].ID, Reference: payments.ChargeKey(orderID),
					Amount: 2990, Currency: orderevents.Currency, Status: "captured"})
			}
			if _, err := admin.Resolve(ctx, sideeffect.Resolution{Name: payments.ChargeName, Key: payments.ChargeKey(orderID),
				As: c.as, Response: response, By: "alice", Reason: "checked with the provider"}); err != nil {
				t.Fatal(err)
			}
			outboxtest.Eventually(t, 30*time.Second, "the resolved charge recorded", func() bool {
				return status(t, e, orderID) == "captured"
			})
			if n := e.charges(t, payments.ChargeKey(orderID)); n != 1 {
				t.Errorf("the provider's ledger shows %d charges, want 1", n)
			}
			if n := e.posts.Load(); n != c.posts {
				t.Errorf("the provider got %d charge requests, want %d", n, c.posts)
			}
			var captured int
			if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.schema+`.outbox_events WHERE aggregate_id = $1 AND event_type = $2`,
				orderID, orderevents.PaymentCaptured).Scan(&captured); err != nil || captured != 1 {
				t.Errorf("%d PaymentCaptured events recorded (%v), want 1", captured, err)
			}
			// A later round of Resume, and a redelivery, change nothing.
			outboxtest.Eventually(t, 30*time.Second, "the charge's wait ended", func() bool {
				var n int
				err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.schema+`.side_effect_waits`).Scan(&n)
				return err == nil && n == 0
			})
			if rep, err := cons.ResumeWaiting(ctx); err != nil || rep != (sideeffect.ResumeReport{}) {
				t.Errorf("ResumeWaiting after the resolution: %+v, %v; want nothing", rep, err)
			}
			if _, err := cons.Handle(ctx, msg, 60); err != nil {
				t.Errorf("a redelivery after the resolution: %v", err)
			}
			if n := e.charges(t, payments.ChargeKey(orderID)); n != 1 {
				t.Errorf("the provider's ledger shows %d charges at the end, want 1", n)
			}
		})
	}
}

func status(t *testing.T, e *env, orderID string) string {
	t.Helper()
	var s string
	err := e.pool.QueryRow(context.Background(), "SELECT status FROM "+e.schema+".payments WHERE order_id = $1", orderID).Scan(&s)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		t.Fatal(err)
	}
	return s
}
