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

// orderTx is one business transaction's body: it writes into tx and
// returns nothing else. It runs between BEGIN and COMMIT.
type orderTx func(ctx context.Context, tx pgx.Tx) error

// writeKinds builds the transactions the write path compares, all on the
// space's schema.
type writeKinds struct {
	orderOnly, sqlEvent, fnEvent, libEvent, libNotifyInTx orderTx
}

func createOrders(ctx context.Context, e *env, schema string) error {
	_, err := e.admin.Exec(ctx, `CREATE TABLE `+schema+`.orders (
	order_id uuid PRIMARY KEY, customer_id text NOT NULL, total_cents bigint NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

func newWriteKinds(schema string, w *outbox.Writer) writeKinds {
	insertOrder := `INSERT INTO ` + schema + `.orders (order_id, customer_id, total_cents) VALUES ($1, $2, $3)`
	// What a careful engineer writes by hand for the same rows: allocate the
	// aggregate's next sequence on its counter row and insert the event, in
	// one statement with typed parameters.
	insertEvent := `WITH seq AS (
	INSERT INTO ` + schema + `.outbox_aggregates AS a (aggregate_type, aggregate_id, last_sequence) VALUES ($2, $3, 1)
	ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = a.last_sequence + 1
	RETURNING last_sequence)
INSERT INTO ` + schema + `.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
SELECT $1, $2, $3, seq.last_sequence, $4, $5::jsonb FROM seq`
	order := func(ctx context.Context, tx pgx.Tx) (uuid.UUID, error) {
		id, _ := uuid.NewV7()
		_, err := tx.Exec(ctx, insertOrder, id, "customer-42", 12345)
		return id, err
	}
	// What a service in another language runs: the SQL write API
	// (migration 011), untyped text parameters as most drivers send them.
	enqueue := `SELECT event_id, sequence FROM ` + schema + `.enqueue($1, $2, $3, $4::text)`
	channel := outbox.NotifyChannel(schema)
	lib := func(ctx context.Context, tx pgx.Tx) error {
		id, err := order(ctx, tx)
		if err != nil {
			return err
		}
		_, err = w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id.String(), Type: "OrderCreated", Payload: []byte(payload)})
		return err
	}
	return writeKinds{
		orderOnly: func(ctx context.Context, tx pgx.Tx) error {
			_, err := order(ctx, tx)
			return err
		},
		sqlEvent: func(ctx context.Context, tx pgx.Tx) error {
			id, err := order(ctx, tx)
			if err != nil {
				return err
			}
			eid, _ := uuid.NewV7()
			_, err = tx.Exec(ctx, insertEvent, eid, "order", id.String(), "OrderCreated", payload)
			return err
		},
		fnEvent: func(ctx context.Context, tx pgx.Tx) error {
			id, err := order(ctx, tx)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, enqueue, "order", id.String(), "OrderCreated", payload)
			return err
		},
		libEvent: lib,
		// The trap the design avoids: NOTIFY inside the writing transaction.
		libNotifyInTx: func(ctx context.Context, tx pgx.Tx) error {
			if err := lib(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", channel)
			return err
		},
	}
}

// closedLoop runs clients goroutines that each commit body in a loop for d
// and returns the number of transactions and their latencies. after, when
// set, runs after each commit (outside the transaction).
func closedLoop(ctx context.Context, pool *pgxpool.Pool, clients int, d time.Duration, body orderTx, after func()) (int, []time.Duration, error) {
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
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t := time.Now()
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return body(ctx, tx) }); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				local = append(local, time.Since(t))
				if after != nil {
					after()
				}
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return len(lat), lat, firstErr
}

// benchWrite compares the business transaction alone, with an event written
// by hand-written SQL and with the library, at each client count. Kinds
// alternate within each round so that drift on a shared machine hits all of
// them alike.
func benchWrite(ctx context.Context, e *env) ([]Result, error) {
	s, cleanup, err := e.newSpace(ctx, "write")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := createOrders(ctx, e, s.schema); err != nil {
		return nil, err
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	if err != nil {
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
	k := newWriteKinds(s.schema, w)
	kinds := []struct {
		name string
		body orderTx
	}{{"order-only", k.orderOnly}, {"order+event-sql", k.sqlEvent}, {"order+event-fn", k.fnEvent}, {"order+event-lib", k.libEvent}}

	type acc struct {
		n   int
		dur time.Duration
		lat []time.Duration
	}
	accs := map[string]*acc{}
	// Warm up the pool, the plans and the caches.
	if _, _, err := closedLoop(ctx, pool, maxClients, 300*time.Millisecond, k.libEvent, nil); err != nil {
		return nil, err
	}
	for round := 0; round < e.sz.writeRounds; round++ {
		for _, c := range e.sz.clients {
			for i := range kinds {
				kd := kinds[(i+round)%len(kinds)] // rotate the order from round to round
				key := fmt.Sprintf("%s/%d", kd.name, c)
				t := time.Now()
				n, lat, err := closedLoop(ctx, pool, c, e.sz.writeDur, kd.body, nil)
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
	rate := map[string]float64{}
	for _, c := range e.sz.clients {
		for _, kd := range kinds {
			key := fmt.Sprintf("%s/%d", kd.name, c)
			a := accs[key]
			r := float64(a.n) / a.dur.Seconds()
			rate[key] = r
			p50, p99, mx := percentiles(a.lat)
			res := Result{Scenario: fmt.Sprintf("write/%s/%dc", kd.name, c), EventsPerSec: f(r), P50: f(p50), P99: f(p99), Max: f(mx),
				Events: int64(a.n), Seconds: a.dur.Seconds(), Unit: "tx/s"}
			switch kd.name {
			case "order+event-sql":
				res.Ratio, res.RatioOf = f(r/rate[fmt.Sprintf("order-only/%d", c)]), fmt.Sprintf("write/order-only/%dc", c)
			case "order+event-fn":
				// Issue 20: the SQL function from another language against
				// the Go writer.
				lib := rate[fmt.Sprintf("order+event-lib/%d", c)]
				if lib == 0 { // the lib kind is listed after this one
					lib = float64(accs[fmt.Sprintf("order+event-lib/%d", c)].n) / accs[fmt.Sprintf("order+event-lib/%d", c)].dur.Seconds()
				}
				res.Ratio, res.RatioOf = f(r/lib), fmt.Sprintf("write/order+event-lib/%dc", c)
				res.Target, res.Met = ">= 0.95", b(r/lib >= 0.95)
			case "order+event-lib":
				res.Ratio, res.RatioOf = f(r/rate[fmt.Sprintf("order+event-sql/%d", c)]), fmt.Sprintf("write/order+event-sql/%dc", c)
				if c == 16 {
					res.Target, res.Met = ">= 0.90", b(r/rate[fmt.Sprintf("order+event-sql/%d", c)] >= 0.9)
				}
			}
			if kd.name == "order-only" {
				res.Note = ""
			}
			out = append(out, res)
			e.logf("%-34s %8.0f tx/s  p50 %.2f ms  p99 %.2f ms", res.Scenario, r, p50, p99)
		}
	}
	for i := range out {
		out[i].Unit = "" // events/s column is tx/s here; each tx writes one event (order-only: none)
	}
	return out, nil
}
