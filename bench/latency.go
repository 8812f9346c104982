package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
)

// ackRecorder notes when the broker acknowledged each event.
type ackRecorder struct {
	next outbox.Publisher
	mu   sync.Mutex
	acks map[uuid.UUID]time.Time
}

func (a *ackRecorder) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := a.next.Publish(ctx, msgs)
	now := time.Now()
	a.mu.Lock()
	for i, m := range msgs {
		if errs == nil || errs[i] == nil {
			if _, ok := a.acks[m.ID]; !ok {
				a.acks[m.ID] = now
			}
		}
	}
	a.mu.Unlock()
	return errs
}

func (a *ackRecorder) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acks)
}

// latencies waits up to 30s for a to have seen every event of commits
// acknowledged and returns their commit-to-ack latencies; an event still
// not acknowledged then is an error.
func (a *ackRecorder) latencies(commits map[uuid.UUID]time.Time) ([]time.Duration, error) {
	deadline := time.Now().Add(30 * time.Second)
	for a.count() < len(commits) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var lat []time.Duration
	missing := 0
	for id, c := range commits {
		ack, ok := a.acks[id]
		if !ok {
			missing++
			continue
		}
		lat = append(lat, ack.Sub(c))
	}
	if missing > 0 {
		return nil, fmt.Errorf("%d of %d events not acknowledged 30s after the load ended", missing, len(commits))
	}
	return lat, nil
}

// latencyRun offers rate events/s (one order + one event per transaction,
// through the library) for d, with an in-process relay at its defaults,
// polling only or woken by a Notifier, and returns commit→ack latencies.
func latencyRun(ctx context.Context, e *env, name string, wake bool) (lat []time.Duration, offered float64, err error) {
	return latencyRunTo(ctx, e, name, wake, nil)
}

// latencyRunTo is latencyRun with the relay publishing through the
// publisher open returns for the run's space (nil: outboxnats on the space's
// stream); its close function runs when the relay stops.
func latencyRunTo(ctx context.Context, e *env, name string, wake bool,
	open func(ctx context.Context, s space) (outbox.Publisher, func(), error)) (lat []time.Duration, offered float64, err error) {
	s, cleanup, err := e.newSpace(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	defer cleanup()
	if open == nil {
		open = func(ctx context.Context, s space) (outbox.Publisher, func(), error) {
			pub, nc, err := e.publisher(ctx, s)
			if err != nil {
				return nil, nil, err
			}
			return pub, nc.Close, nil
		}
	}
	load, err := newOrderLoad(ctx, e, s)
	if err != nil {
		return nil, 0, err
	}
	defer load.Close()
	rec := &ackRecorder{acks: map[uuid.UUID]time.Time{}}
	ph := &phases{}
	pub, closePub, err := open(ctx, s)
	if err != nil {
		return nil, 0, err
	}
	_, stopRelay, err := startRelayTo(ctx, e, s, pub, closePub, outbox.RelayConfig{DisableNotify: !wake, Observer: ph},
		func(p outbox.Publisher) outbox.Publisher { rec.next = p; return rec })
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = stopRelay() }()
	var notifier *outbox.Notifier
	if wake {
		if notifier, err = outbox.NewNotifier(load.pool, outbox.NotifierConfig{Schema: s.schema, Logger: quietLogger()}); err != nil {
			return nil, 0, err
		}
		defer notifier.Close()
	}
	time.Sleep(300 * time.Millisecond) // relay started and listening

	var afterCommit func()
	if notifier != nil {
		afterCommit = notifier.Notify
	}
	commits, offered, elapsed, err := load.offer(ctx, afterCommit)
	e.logf("%s: relay %s", name, ph.String(elapsed))
	e.logf("%s: %s", name, load.txSummary())
	if err != nil {
		return nil, 0, err
	}
	if lat, err = rec.latencies(commits); err != nil {
		return nil, 0, err
	}
	return lat, offered, nil
}

// notifyWriteRun measures the library write path at 16 clients for d with a
// relay running at its defaults, in three modes: no wake-up ("off"),
// a Notifier after each commit ("notifier"), and pg_notify inside each
// transaction ("in-tx", the trap). Modes alternate within each round.
func notifyWriteRun(ctx context.Context, e *env) (map[string]float64, map[string][]time.Duration, error) {
	s, cleanup, err := e.newSpace(ctx, "notify-write")
	if err != nil {
		return nil, nil, err
	}
	defer cleanup()
	if err := createOrders(ctx, e, s.schema); err != nil {
		return nil, nil, err
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	if err != nil {
		return nil, nil, err
	}
	k := newWriteKinds(s.schema, w)
	wpool, err := e.pool(ctx, 17)
	if err != nil {
		return nil, nil, err
	}
	defer wpool.Close()
	_, stopRelay, err := startRelay(ctx, e, s, outbox.RelayConfig{}, nil)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = stopRelay() }()
	notifier, err := outbox.NewNotifier(wpool, outbox.NotifierConfig{Schema: s.schema, Logger: quietLogger()})
	if err != nil {
		return nil, nil, err
	}
	defer notifier.Close()
	if _, _, err := closedLoop(ctx, wpool, 16, 300*time.Millisecond, k.libEvent, nil); err != nil {
		return nil, nil, err
	}
	counts := map[string]int{}
	durs := map[string]time.Duration{}
	lats := map[string][]time.Duration{}
	modes := []struct {
		name  string
		body  orderTx
		after func()
	}{{"off", k.libEvent, nil}, {"notifier", k.libEvent, notifier.Notify}, {"in-tx", k.libNotifyInTx, nil}}
	for round := 0; round < e.sz.writeRounds; round++ {
		for _, m := range modes {
			t := time.Now()
			n, lat, err := closedLoop(ctx, wpool, 16, e.sz.notifyWriteDur, m.body, m.after)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", m.name, err)
			}
			counts[m.name] += n
			durs[m.name] += time.Since(t)
			lats[m.name] = append(lats[m.name], lat...)
		}
	}
	rates := map[string]float64{}
	for name, n := range counts {
		rates[name] = float64(n) / durs[name].Seconds()
	}
	return rates, lats, nil
}

func benchLatency(ctx context.Context, e *env) ([]Result, error) {
	var out []Result
	for _, mode := range []struct {
		name string
		wake bool
	}{{"polling", false}, {"wakeup", true}} {
		lat, offered, err := latencyRun(ctx, e, "latency-"+mode.name, mode.wake)
		if err != nil {
			return out, fmt.Errorf("latency %s: %w", mode.name, err)
		}
		p50, p99, mx := percentiles(lat)
		res := Result{Scenario: fmt.Sprintf("latency/commit-to-ack/%s", mode.name), EventsPerSec: f(offered),
			P50: f(p50), P99: f(p99), Max: f(mx), Events: int64(len(lat)), Seconds: e.sz.latencyDur.Seconds(),
			Note: fmt.Sprintf("offered %d events/s for %s, one event per transaction", e.sz.latencyRate, e.sz.latencyDur)}
		if mode.wake {
			res.Target, res.Met = "p99 <= 25 ms", b(p99 <= 25)
		}
		e.logf("%s: p50 %.1f ms p99 %.1f ms max %.1f ms at %.0f events/s", res.Scenario, p50, p99, mx, offered)
		out = append(out, res)
	}
	rates, lats, err := notifyWriteRun(ctx, e)
	if err != nil {
		return out, err
	}
	for _, m := range []string{"off", "notifier", "in-tx"} {
		p50, p99, mx := percentiles(lats[m])
		res := Result{Scenario: "latency/write-16c/wakeup-" + m, EventsPerSec: f(rates[m]), P50: f(p50), P99: f(p99), Max: f(mx),
			Events: int64(len(lats[m]))}
		if m != "off" {
			res.Ratio, res.RatioOf = f(rates[m]/rates["off"]), "latency/write-16c/wakeup-off"
		}
		switch m {
		case "off":
			res.Note = "library write path (tx/s), relay running, no wake-up"
		case "notifier":
			res.Target, res.Met = ">= 0.90", b(rates[m]/rates["off"] >= 0.9)
			res.Note = "outbox.Notifier: coalesced pg_notify after commit, off the request path"
		case "in-tx":
			res.Note = "pg_notify inside each writing transaction (the trap; for comparison)"
		}
		e.logf("%s: %.0f tx/s", res.Scenario, rates[m])
		out = append(out, res)
	}
	return out, nil
}
