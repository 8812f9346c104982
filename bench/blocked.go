package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/outbox"
)

// benchBlocked measures the relay's claim with 0, 100k and 1M events waiting
// behind one quarantined head (issue 8): the claim's execution time and the
// shared buffers it touches (EXPLAIN (ANALYZE, BUFFERS), median of several
// claims, each rolled back), on the same healthy backlog. It also reports how
// long the settle that quarantined the head took: with parked lanes that
// transaction moves every waiting event out of the claim's range.
func benchBlocked(ctx context.Context, e *env) ([]Result, error) {
	counts := []int{0, 100_000, 1_000_000}
	if e.o.quick {
		counts = []int{0, 5_000, 20_000}
	}
	var out []Result
	var base float64
	for _, n := range counts {
		r, err := blockedOnce(ctx, e, n)
		if err != nil {
			return out, err
		}
		if n == 0 {
			base = *r.Value
		} else {
			r.Ratio, r.RatioOf = f(*r.Value/base), out[0].Scenario
		}
		out = append(out, r)
	}
	return out, nil
}

// blockedHealthy is the healthy backlog every measurement claims from.
const blockedHealthy, blockedHealthyLanes = 20_000, 2_000

var (
	planBuffersRE = regexp.MustCompile(`Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?`)
	planExecRE    = regexp.MustCompile(`Execution Time: ([0-9.]+) ms`)
)

// settleTimer records the duration of the settle that recorded a failure.
type settleTimer struct{ ns atomic.Int64 }

func (s *settleTimer) ObserveSettle(o outbox.SettleObservation) {
	if o.Op == outbox.SettleRecordFailures && o.Err == nil {
		s.ns.Store(int64(o.Duration))
	}
}

func blockedOnce(ctx context.Context, e *env, n int) (Result, error) {
	s, clean, err := e.newSpace(ctx, "blocked-"+human(n))
	if err != nil {
		return Result{}, err
	}
	defer clean()
	// The blocked lane: n+1 events, the oldest of the table, as another
	// writer would insert them (one statement).
	t := time.Now()
	if _, err := e.admin.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, available_at)
SELECT lpad(to_hex(i + 1), 32, '0')::uuid, 'order', 'blocked', i + 1, 'OrderUpdated', %[2]s::jsonb, t, t
FROM (SELECT i, now() - interval '2 hours' + i * interval '1 microsecond' AS t FROM generate_series(0, %[3]d) AS i) g;
INSERT INTO %[1]s.outbox_aggregates (aggregate_type, aggregate_id, last_sequence) VALUES ('order', 'blocked', %[3]d + 1)`,
		s.schema, quote(payload), n)); err != nil {
		return Result{}, fmt.Errorf("load blocked lane: %w", err)
	}
	if _, err := e.admin.Exec(ctx, "VACUUM (ANALYZE) "+s.schema+".outbox_events"); err != nil {
		return Result{}, fmt.Errorf("vacuum: %w", err)
	}
	e.logf("blocked %s: lane of %d events loaded in %s", human(n), n+1, time.Since(t).Round(time.Millisecond))

	// A relay quarantines its head (a permanent error), parking the lane.
	pool, err := e.relayPool(ctx, 4)
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()
	refuse := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = outbox.Permanent(errors.New("refused"))
		}
		return errs
	})
	timer := &settleTimer{}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: s.schema, Publisher: refuse, Logger: quietLogger(), Observer: timer})
	if err != nil {
		return Result{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	t = time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	limit := time.Now().Add(10 * time.Minute)
	for r.Stats().Quarantined < 1 && time.Now().Before(limit) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	// The settle parks up to 10,000 events; the relay's lane sweep the rest.
	for time.Now().Before(limit) && ctx.Err() == nil {
		var left bool
		if err := e.admin.QueryRow(ctx, `SELECT parked_through IS DISTINCT FROM last_sequence FROM `+s.schema+`.outbox_aggregates
			WHERE aggregate_type = 'order' AND aggregate_id = 'blocked'`).Scan(&left); err != nil {
			stop()
			<-done
			return Result{}, err
		}
		if !left {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	parked := time.Since(t)
	stop()
	if err := <-done; err != nil {
		return Result{}, err
	}
	if r.Stats().Quarantined < 1 {
		return Result{}, fmt.Errorf("blocked %s: the head was not quarantined", human(n))
	}
	settle := time.Duration(timer.ns.Load())
	e.logf("blocked %s: head quarantined, settle transaction %s, lane parked %s after the relay started", human(n),
		settle.Round(time.Millisecond), parked.Round(time.Millisecond))

	// The healthy backlog, newer than the blocked lane; loadBacklog vacuums
	// (as autovacuum would: the parked rows' old versions are dead).
	if err := e.loadBacklog(ctx, s.schema, blockedHealthy, blockedHealthyLanes, "h-", 1<<40, false); err != nil {
		return Result{}, err
	}
	rx, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: s.schema, Publisher: refuse, Logger: quietLogger()})
	if err != nil {
		return Result{}, err
	}
	var ms, bufs []float64
	for i := 0; i < 6; i++ {
		plan, err := rx.ExplainClaim(ctx)
		if err != nil {
			return Result{}, err
		}
		if i == 0 {
			continue // warm-up
		}
		m := planBuffersRE.FindStringSubmatch(plan)
		x := planExecRE.FindStringSubmatch(plan)
		if m == nil || x == nil {
			return Result{}, fmt.Errorf("blocked %s: unexpected plan:\n%s", human(n), plan)
		}
		hit, _ := strconv.ParseFloat(m[1], 64)
		read, _ := strconv.ParseFloat(m[2], 64)
		exec, _ := strconv.ParseFloat(x[1], 64)
		bufs, ms = append(bufs, hit+read), append(ms, exec)
	}
	slices.Sort(bufs)
	slices.Sort(ms)
	med := func(v []float64) float64 { return v[len(v)/2] }
	e.logf("blocked %s: claim %.1f ms, %.0f shared buffers (median of %d)", human(n), med(ms), med(bufs), len(ms))
	return Result{
		Scenario: fmt.Sprintf("blocked/%s-events", human(n)), P50: f(med(ms)), Value: f(med(bufs)), Unit: "buffers/claim",
		Events: int64(n), Seconds: parked.Seconds(),
		Note: fmt.Sprintf("claim of 1,000 over %d healthy events in %d lanes; p50 = claim execution ms; settle that quarantined the head %.2f s; seconds = relay start to all %d parked",
			blockedHealthy, blockedHealthyLanes, settle.Seconds(), n),
	}, nil
}
