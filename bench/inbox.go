package main

// The "inbox" group: the SQL inbox (inbox_claim, migration 012), as a
// consumer in another language calls it, beside the Go inbox (inbox.Inbox),
// applying events with the same effect at 1, 4 and 16 clients. Issue 20's
// target: the SQL inbox at 0.95x or more of the Go inbox's applied events
// per second.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
)

// applyLoop runs clients goroutines that each apply events in a loop for d,
// each client on aggregates of its own (a new aggregate every 10 events),
// and returns how many were applied and their latencies.
func applyLoop(ctx context.Context, clients int, d time.Duration, tag string, apply func(ctx context.Context, m outbox.Message) error) (int, []time.Duration, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			agg, seq := uuid.NewString(), int64(0)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if seq == 10 {
					agg, seq = uuid.NewString(), 0
				}
				seq++
				m := outbox.Message{ID: uuid.Must(uuid.NewV7()), AggregateType: tag, AggregateID: agg, Sequence: seq, Type: "OrderCreated",
					Payload: []byte(payload), OccurredAt: time.Now()}
				t := time.Now()
				if err := apply(ctx, m); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				local = append(local, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return len(lat), lat, firstErr
}

func benchInbox(ctx context.Context, e *env) ([]Result, error) {
	s, cleanup, err := e.newSpace(ctx, "inbox")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if _, err := e.admin.Exec(ctx, `CREATE TABLE `+s.schema+`.effects (event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, sequence bigint NOT NULL)`); err != nil {
		return nil, err
	}
	maxClients := 0
	for _, c := range e.sz.clients {
		maxClients = max(maxClients, c)
	}
	pool, err := e.pool(ctx, int32(maxClients))
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	in, err := inbox.New(pool, inbox.Config{Schema: s.schema, Consumer: "bench-go"})
	if err != nil {
		return nil, err
	}
	effect := `INSERT INTO ` + s.schema + `.effects VALUES ($1, $2, $3)`
	claim := `SELECT ` + s.schema + `.inbox_claim($1, $2, $3, $4, $5)`
	applied := fmt.Errorf("not applied")
	kinds := []struct {
		name  string
		apply func(ctx context.Context, m outbox.Message) error
	}{
		{"go", func(ctx context.Context, m outbox.Message) error {
			o, err := in.Handle(ctx, m, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, effect, m.ID, m.AggregateID, m.Sequence)
				return err
			})
			if err == nil && o != inbox.Applied {
				return fmt.Errorf("%s #%d: %v: %w", m.AggregateID, m.Sequence, o, applied)
			}
			return err
		}},
		{"sql", func(ctx context.Context, m outbox.Message) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var answer string
				if err := tx.QueryRow(ctx, claim, "bench-sql", m.ID, m.AggregateType, m.AggregateID, m.Sequence).Scan(&answer); err != nil {
					return err
				}
				if answer != "apply" {
					return fmt.Errorf("%s #%d: %s: %w", m.AggregateID, m.Sequence, answer, applied)
				}
				_, err := tx.Exec(ctx, effect, m.ID, m.AggregateID, m.Sequence)
				return err
			})
		}},
	}
	type acc struct {
		n   int
		dur time.Duration
		lat []time.Duration
	}
	accs := map[string]*acc{}
	for _, kd := range kinds { // warm up
		if _, _, err := applyLoop(ctx, maxClients, 300*time.Millisecond, "warm", kd.apply); err != nil {
			return nil, fmt.Errorf("%s: %w", kd.name, err)
		}
	}
	for round := 0; round < e.sz.writeRounds; round++ {
		for _, c := range e.sz.clients {
			for i := range kinds {
				kd := kinds[(i+round)%len(kinds)]
				key := fmt.Sprintf("%s/%d", kd.name, c)
				t := time.Now()
				n, lat, err := applyLoop(ctx, c, e.sz.writeDur, "order", kd.apply)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", key, err)
				}
				a := accs[key]
				if a == nil {
					a = &acc{}
					accs[key] = a
				}
				a.n += n
				a.dur += time.Since(t)
				a.lat = append(a.lat, lat...)
			}
		}
	}
	var out []Result
	for _, c := range e.sz.clients {
		goRate := float64(accs[fmt.Sprintf("go/%d", c)].n) / accs[fmt.Sprintf("go/%d", c)].dur.Seconds()
		for _, kd := range kinds {
			a := accs[fmt.Sprintf("%s/%d", kd.name, c)]
			r := float64(a.n) / a.dur.Seconds()
			p50, p99, mx := percentiles(a.lat)
			res := Result{Scenario: fmt.Sprintf("inbox/%s/%dc", kd.name, c), EventsPerSec: f(r), P50: f(p50), P99: f(p99), Max: f(mx),
				Events: int64(a.n), Seconds: a.dur.Seconds()}
			if kd.name == "sql" {
				res.Ratio, res.RatioOf = f(r/goRate), fmt.Sprintf("inbox/go/%dc", c)
				res.Target, res.Met = ">= 0.95", b(r/goRate >= 0.95)
			}
			out = append(out, res)
			e.logf("%-20s %8.0f applied/s  p50 %.2f ms  p99 %.2f ms", res.Scenario, r, p50, p99)
		}
	}
	return out, nil
}
