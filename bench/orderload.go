package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
)

// orderLoad is the load of the commit-to-ack latency runs (polling, woken
// polling, destinations, CDC): one order and one OrderCreated event per
// transaction, through the library, from latencyClients (16) clients into a
// space.
type orderLoad struct {
	e    *env
	s    space
	w    *outbox.Writer
	pool *pgxpool.Pool

	mu sync.Mutex
	tx []time.Duration // each committed transaction's duration, begin to commit
}

// txSummary describes the writers' transactions so far: what the relay
// (or the capture) running beside them costs them at this load.
func (l *orderLoad) txSummary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	p50, p99, mx := percentiles(l.tx)
	return fmt.Sprintf("writer transactions p50 %.2f ms, p99 %.2f ms, max %.1f ms (%d)", p50, p99, mx, len(l.tx))
}

// newOrderLoad creates the orders table in s and the writer's pool; Close
// the load when done.
func newOrderLoad(ctx context.Context, e *env, s space) (*orderLoad, error) {
	if err := createOrders(ctx, e, s.schema); err != nil {
		return nil, err
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	if err != nil {
		return nil, err
	}
	pool, err := e.pool(ctx, int32(e.sz.latencyClients))
	if err != nil {
		return nil, err
	}
	return &orderLoad{e: e, s: s, w: w, pool: pool}, nil
}

// Close closes the writer's pool.
func (l *orderLoad) Close() { l.pool.Close() }

// offer offers the latency load (latencyRate for latencyDur), calling
// afterCommit, when not nil, after each commit, and returns each event's
// commit time, the rate offered and how long the load took (also with an
// error).
func (l *orderLoad) offer(ctx context.Context, afterCommit func()) (commits map[uuid.UUID]time.Time, offered float64, elapsed time.Duration, err error) {
	return l.offerAt(ctx, l.e.sz.latencyRate, l.e.sz.latencyDur, afterCommit)
}

// offerAt is offer at rate events/s for d.
func (l *orderLoad) offerAt(ctx context.Context, rate int, d time.Duration, afterCommit func()) (commits map[uuid.UUID]time.Time, offered float64, elapsed time.Duration, err error) {
	var mu sync.Mutex
	commits = map[uuid.UUID]time.Time{}
	sent, elapsed, err := offerLoad(ctx, rate, d, l.e.sz.latencyClients, func() error {
		var id uuid.UUID
		began := time.Now()
		err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
			oid, _ := uuid.NewV7()
			if _, err := tx.Exec(ctx, `INSERT INTO `+l.s.schema+`.orders (order_id, customer_id, total_cents) VALUES ($1, $2, $3)`, oid, "customer-42", 12345); err != nil {
				return err
			}
			recs, err := l.w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: oid.String(), Type: "OrderCreated", Payload: []byte(payload)})
			if err == nil {
				id = recs[0].ID
			}
			return err
		})
		committed := time.Now()
		if err != nil {
			return err
		}
		if afterCommit != nil {
			afterCommit()
		}
		mu.Lock()
		commits[id] = committed
		mu.Unlock()
		l.mu.Lock()
		l.tx = append(l.tx, committed.Sub(began))
		l.mu.Unlock()
		return nil
	})
	return commits, float64(sent) / elapsed.Seconds(), elapsed, err
}
