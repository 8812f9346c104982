package outboxamqp_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/rabbittest"
	"github.com/pgoutbox/outbox/outboxamqp"
)

// TestMissingBindingQuarantinesNothing (issue 19, item 6): a message no
// queue is bound for comes back (mandatory, 312 NO_ROUTE). Nothing is wrong
// with the message: the route is missing. The relay quarantines nothing,
// spends no attempt, says why it is not ready, and once a queue is bound
// delivers everything in order. Two cases: no binding at all, and one
// aggregate type's binding missing while another's is there (those flow
// meanwhile).
func TestMissingBindingQuarantinesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		bound []string // aggregate types bound from the start
	}{
		{"NoBinding", nil},
		{"OneRouteMissing", []string{"order"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var keys []string
			for _, typ := range tc.bound {
				keys = append(keys, "outbox."+typ)
			}
			p, b := setupQueue(t, rabbittest.URL(), outboxamqp.Config{}, false, keys...)
			pool, schema := outboxtest.Schema(t)
			writeLanes(t, pool, schema, []string{"order", "payment"}, 3, 3)

			// Held events wait an hour: only the relay's probe of the route,
			// one held event made due at a time, and the release of them all
			// once one is published, can deliver them within the test.
			obs := &routesRecorder{}
			r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: p, PollInterval: 20 * time.Millisecond,
				RetryBackoffMin: time.Hour, RetryBackoffMax: time.Hour, OutageProbeMax: 200 * time.Millisecond, MaxAttempts: 2,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()
			t.Cleanup(func() { cancel(); <-done })

			// The bound type's events flow; the unbound one's are held, and
			// the relay says which route is missing. It probes the route with
			// one held event at a time: were those refusals counted, the
			// event would be quarantined at its second (MaxAttempts).
			unbound := 3 * (2 - len(tc.bound)) // lanes without a route
			var published, quarantined, attempts int
			for deadline := time.Now().Add(30 * time.Second); ; {
				if err := pool.QueryRow(ctx, `SELECT count(published_at), count(quarantined_at), coalesce(sum(attempt_count), 0) FROM `+schema+`.outbox_events`).
					Scan(&published, &quarantined, &attempts); err != nil {
					t.Fatal(err)
				}
				err := r.Ready()
				if err != nil && strings.Contains(err.Error(), "outbox.payment") && r.Stats().Failed >= int64(unbound+3) && obs.refused.Load() > 0 {
					t.Logf("ready: %v", err)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 30s: %d failed publishes, %d quarantined, %d attempts spent, %d published; ready: %v; want the failures held and the missing route reported",
						r.Stats().Failed, quarantined, attempts, published, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			wantPublished := 9 * len(tc.bound)
			if quarantined != 0 || attempts != 0 || published != wantPublished {
				t.Fatalf("with a route missing: %d quarantined, %d attempts spent, %d published; want 0, 0, %d (failed publishes so far: %d; ready: %v)",
					quarantined, attempts, published, wantPublished, r.Stats().Failed, r.Ready())
			}

			// Bind the missing routes: everything is delivered, in order.
			for _, typ := range []string{"order", "payment"} {
				if err := b.ch.QueueBind(b.queue, "outbox."+typ, b.exchange, false, nil); err != nil {
					t.Fatal(err)
				}
			}
			outboxtest.Eventually(t, 30*time.Second, "everything published once bound", func() bool {
				var left int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&left); err != nil {
					t.Fatal(err)
				}
				return left == 0
			})
			outboxtest.Eventually(t, 10*time.Second, "the relay ready again", func() bool { return r.Ready() == nil && obs.refused.Load() == 0 })
			last := map[string]int64{}
			for _, d := range b.read(t, 18) {
				m, err := outboxamqp.Decode(d)
				if err != nil {
					t.Fatal(err)
				}
				key := m.AggregateType + "/" + m.AggregateID
				if m.Sequence != last[key]+1 {
					t.Fatalf("%s: #%d delivered after #%d", key, m.Sequence, last[key])
				}
				last[key] = m.Sequence
			}
			if err := pool.QueryRow(ctx, `SELECT count(quarantined_at), coalesce(sum(attempt_count), 0) FROM `+schema+`.outbox_events`).
				Scan(&quarantined, &attempts); err != nil {
				t.Fatal(err)
			}
			if quarantined != 0 || attempts != 0 {
				t.Fatalf("%d quarantined, %d attempts spent; want none", quarantined, attempts)
			}
		})
	}
}

// writeLanes commits perLane events to each of lanes aggregates of each
// type, in one transaction.
func writeLanes(t *testing.T, pool *pgxpool.Pool, schema string, types []string, lanes, perLane int) {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for seq := 0; seq < perLane; seq++ {
			for _, typ := range types {
				for l := 0; l < lanes; l++ {
					if _, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: typ, AggregateID: typ + "-" + strconv.Itoa(l),
						Type: "Step", Payload: []byte(`{"seq":` + strconv.Itoa(seq+1) + `}`)}); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// routesRecorder is a DestinationObserver keeping the last count of refused
// routes.
type routesRecorder struct{ refused atomic.Int64 }

func (o *routesRecorder) ObserveDestination(d outbox.DestinationObservation) {
	o.refused.Store(int64(d.RefusedRoutes))
}
