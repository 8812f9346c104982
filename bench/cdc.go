package main

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/outboxcdc"
)

// benchCDC is the "cdc" group (only when named): on a private cluster with
// wal_level=logical (the shared server has replica), side by side in one
// run, the commit-to-ack latency of the polling relay woken by a Notifier
// and of the CDC relay at the same offered rate, and the library write path
// with a CDC relay streaming against a polling relay alone.
func benchCDC(ctx context.Context, e *env) ([]Result, error) {
	pe, closeCluster, err := cdcCluster(ctx, e)
	if err != nil {
		return nil, err
	}
	defer closeCluster()

	var out []Result
	note := fmt.Sprintf("offered %d events/s for %s, one event per transaction, private cluster (wal_level=logical)", e.sz.latencyRate, e.sz.latencyDur)
	for _, mode := range []string{"wakeup", "cdc"} {
		var lat []time.Duration
		var offered float64
		if mode == "cdc" {
			lat, offered, err = cdcLatencyRun(ctx, pe)
		} else {
			lat, offered, err = latencyRun(ctx, pe, "cdc-cmp-wakeup", true)
		}
		if err != nil {
			return out, fmt.Errorf("latency %s: %w", mode, err)
		}
		p50, p99, mx := percentiles(lat)
		res := Result{Scenario: "cdc/commit-to-ack/" + mode, EventsPerSec: f(offered), P50: f(p50), P99: f(p99), Max: f(mx),
			Events: int64(len(lat)), Seconds: e.sz.latencyDur.Seconds(), Note: note}
		if mode == "cdc" {
			res.Target, res.Met = "p99 <= 10 ms", b(p99 <= 10)
		}
		e.logf("%s: p50 %.1f ms p99 %.1f ms max %.1f ms at %.0f events/s", res.Scenario, p50, p99, mx, offered)
		out = append(out, res)
	}
	drain, err := cdcDrainRun(ctx, pe)
	out = append(out, drain...)
	if err != nil {
		return out, err
	}
	rates, keptUp, err := cdcWriteRun(ctx, pe)
	if err != nil {
		return out, err
	}
	notes := map[string]string{
		"none":    "no relay, no slot: the writers' ceiling",
		"polling": "a polling relay at its defaults, no slot",
		"capture": "the slot streamed by pg_recvlogical to /dev/null: PostgreSQL's logical decoding alone, no relay",
		"cdc":     "a CDC relay streaming the slot (and its safety net)",
	}
	for _, m := range writeModes {
		res := Result{Scenario: "cdc/write-16c/" + m, EventsPerSec: f(rates[m]),
			Note: fmt.Sprintf("library write path (tx/s), %s; %.0f%% of the window's events published in it", notes[m], 100*keptUp[m])}
		switch m {
		case "capture":
			res.Ratio, res.RatioOf = f(rates[m]/rates["none"]), "cdc/write-16c/none"
		case "cdc":
			res.Ratio, res.RatioOf = f(rates[m]/rates["polling"]), "cdc/write-16c/polling"
			res.Target, res.Met = ">= 0.95", b(rates[m]/rates["polling"] >= 0.95)
		}
		out = append(out, res)
		e.logf("cdc/write-16c/%s: %.0f tx/s, %.0f%% published in the window", m, rates[m], 100*keptUp[m])
	}
	return out, nil
}

// cdcCluster starts the CDC groups' private cluster (wal_level=logical, 256
// MB shared buffers, otherwise defaults) and an env on it.
func cdcCluster(ctx context.Context, e *env) (*env, func(), error) {
	cluster, err := pgcluster.Start(pgcluster.Config{Settings: map[string]string{
		"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10",
		"max_connections": "100", "shared_buffers": "256MB"}})
	if err != nil {
		return nil, nil, err
	}
	o := e.o
	o.databaseURL = cluster.URL("")
	pe, err := newEnv(ctx, o, e.logw)
	if err != nil {
		_ = cluster.Close()
		return nil, nil, err
	}
	e.logf("cdc: private cluster with wal_level=logical on port %d", cluster.Port())
	return pe, func() { pe.close(); _ = cluster.Close() }, nil
}

// cdcDrainRun: a backlog written while no relay ran (an outage), the WAL
// the slot retained for it, and its drain by the CDC relay (no safety net:
// the stream alone) against the polling relay on an identical backlog.
func cdcDrainRun(ctx context.Context, e *env) ([]Result, error) {
	n, aggs := e.sz.backlog, e.sz.aggregates
	var out []Result
	// CDC: the slot exists (Setup), then the backlog is written, then the
	// relay starts and reads it all from the slot.
	s, cleanup, err := e.newSpace(ctx, "cdc-drain")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	slot := outboxcdc.SlotName(s.schema, outboxcdc.GroupDefault)
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: e.admin, Schema: s.schema}); err != nil {
		return nil, err
	}
	defer func() {
		_, _ = e.admin.Exec(context.WithoutCancel(ctx), "SELECT pg_drop_replication_slot($1)", slot)
	}()
	if err := e.loadBacklog(ctx, s.schema, n, aggs, "cdc", 0, false); err != nil {
		return nil, err
	}
	var retained int64
	if err := e.admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&retained); err != nil {
		return nil, err
	}
	perEvent := float64(retained) / float64(n)
	out = append(out, Result{Scenario: "cdc/wal-retained-per-event", Value: f(perEvent),
		Note: fmt.Sprintf("bytes of WAL the slot held after a %d-event backlog was written with no relay (%.0f MB per minute of outage at 1,000 events/s, this payload)",
			n, perEvent*60_000/1e6)})
	e.logf("cdc: the slot retained %d bytes for %d events (%.0f B/event)", retained, n, perEvent)

	cdcDur, err := drainCDC(ctx, e, s, n, "cdc/drain/cdc")
	if err != nil {
		return out, err
	}
	out = append(out, Result{Scenario: "cdc/drain/cdc", EventsPerSec: f(float64(n) / cdcDur.Seconds()), Events: int64(n), Seconds: cdcDur.Seconds(),
		Note: fmt.Sprintf("a %d-event backlog over %d aggregates read from the slot and published by the stream alone", n, aggs)})
	e.logf("cdc/drain/cdc: %d events in %s", n, cdcDur.Round(time.Millisecond))

	// Polling, on an identical backlog of the same cluster.
	ps, pcleanup, err := e.newSpace(ctx, "cdc-drain-polling")
	if err != nil {
		return out, err
	}
	defer pcleanup()
	if err := e.loadBacklog(ctx, ps.schema, n, aggs, "cdc", 0, false); err != nil {
		return out, err
	}
	pollDur, _, err := drainOurs(ctx, e, ps, n, nil)
	if err != nil {
		return out, err
	}
	out = append(out, Result{Scenario: "cdc/drain/polling", EventsPerSec: f(float64(n) / pollDur.Seconds()), Events: int64(n), Seconds: pollDur.Seconds(),
		Note: "the same backlog drained by the polling relay on the same cluster"})
	out[len(out)-2].Ratio, out[len(out)-2].RatioOf = f(pollDur.Seconds()/cdcDur.Seconds()), "cdc/drain/polling"
	e.logf("cdc/drain/polling: %d events in %s", n, pollDur.Round(time.Millisecond))
	return out, nil
}

// startCDC starts a CDC relay (with its safety net) on the space, its
// publisher wrapped by wrap, and waits until it streams.
func startCDC(ctx context.Context, e *env, s space, wrap func(outbox.Publisher) outbox.Publisher, obs any) (*outboxcdc.Relay, func() error, error) {
	pub, nc, err := e.publisher(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	pool, err := e.relayPool(ctx, 6)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	var p outbox.Publisher = pub
	if wrap != nil {
		p = wrap(pub)
	}
	cfg := outbox.RelayConfig{Schema: s.schema, Publisher: p, Logger: quietLogger(), ID: "bench-cdc", DisableNotify: true}
	idsCfg := cfg
	idsCfg.Observer = obs
	ids, err := outbox.NewRelay(pool, idsCfg)
	if err != nil {
		return nil, nil, err
	}
	cfg.ID, cfg.ReconcileAfter, cfg.DisableNotify = "bench-cdc-net", 10*time.Second, false
	net, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		return nil, nil, err
	}
	c, err := outboxcdc.New(outboxcdc.Config{DatabaseURL: e.o.databaseURL, Pool: pool, Schema: s.schema, Relay: ids, SafetyNet: net, Logger: quietLogger()})
	if err != nil {
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	stop := func() error {
		cancel()
		err := <-done
		nc.Close()
		pool.Close()
		return err
	}
	for !c.Stats().Streaming() {
		select {
		case err := <-done:
			cancel()
			nc.Close()
			pool.Close()
			return nil, nil, fmt.Errorf("cdc relay stopped before streaming: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return c, stop, nil
}

// cdcLatencyRun is latencyRun with a CDC relay instead of the woken polling
// relay.
func cdcLatencyRun(ctx context.Context, e *env) (lat []time.Duration, offered float64, err error) {
	s, cleanup, err := e.newSpace(ctx, "cdc-latency")
	if err != nil {
		return nil, 0, err
	}
	defer cleanup()
	load, err := newOrderLoad(ctx, e, s)
	if err != nil {
		return nil, 0, err
	}
	defer load.Close()
	rec := &ackRecorder{acks: map[uuid.UUID]time.Time{}}
	ph := &phases{}
	c, stop, err := startCDC(ctx, e, s, func(p outbox.Publisher) outbox.Publisher { rec.next = p; return rec }, ph)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = stop() }()
	commits, offered, elapsed, err := load.offer(ctx, nil)
	if err != nil {
		return nil, 0, err
	}
	e.logf("cdc latency: PublishIDs %s", ph.String(elapsed))
	e.logf("cdc latency: %s", load.txSummary())
	lat, err = rec.latencies(commits)
	e.logf("cdc latency: the stream published %d, left %d to the safety net", c.Stats().Published(), c.Stats().Left())
	if err != nil {
		return nil, 0, err
	}
	return lat, offered, nil
}

// writeModes are the cdcWriteRun modes: no relay and no slot (the writers'
// ceiling), a polling relay (no slot), the slot streamed by pg_recvlogical
// to /dev/null (PostgreSQL's logical decoding alone, no relay), and the CDC
// relay with its safety net.
var writeModes = []string{"none", "polling", "capture", "cdc"}

// writeRound is one mode's closed-loop writes: transactions and the events
// published while they ran.
type writeRound struct {
	n         int
	d         time.Duration
	published int64
}

// cdcWriteRun measures the library write path at 16 clients in each of
// writeModes, alternating them writeRounds times, and returns each mode's
// tx/s and the share of the window's events its relay published in the
// window.
func cdcWriteRun(ctx context.Context, e *env) (rates, keptUp map[string]float64, err error) {
	sum := map[string]writeRound{}
	for round := 0; round < e.sz.writeRounds; round++ {
		for _, mode := range writeModes {
			r, err := cdcWriteOnce(ctx, e, mode, round)
			if err != nil {
				return nil, nil, fmt.Errorf("write %s: %w", mode, err)
			}
			t := sum[mode]
			t.n, t.d, t.published = t.n+r.n, t.d+r.d, t.published+r.published
			sum[mode] = t
		}
	}
	rates, keptUp = map[string]float64{}, map[string]float64{}
	for m, t := range sum {
		rates[m] = float64(t.n) / t.d.Seconds()
		keptUp[m] = float64(t.published) / float64(t.n)
	}
	return rates, keptUp, nil
}

// cdcWriteOnce runs one closed loop of the write path on a fresh space with
// the mode's relay running, and counts the events published during it.
func cdcWriteOnce(ctx context.Context, e *env, mode string, round int) (writeRound, error) {
	var r writeRound
	s, cleanup, err := e.newSpace(ctx, fmt.Sprintf("cdc-write-%s-%d", mode, round))
	if err != nil {
		return r, err
	}
	defer cleanup()
	if err := createOrders(ctx, e, s.schema); err != nil {
		return r, err
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	if err != nil {
		return r, err
	}
	k := newWriteKinds(s.schema, w)
	wpool, err := e.pool(ctx, 17)
	if err != nil {
		return r, err
	}
	defer wpool.Close()
	stop := func() error { return nil }
	slot := false
	switch mode {
	case "cdc":
		_, stop, err = startCDC(ctx, e, s, nil, nil)
		slot = true
	case "polling":
		_, stop, err = startRelay(ctx, e, s, outbox.RelayConfig{}, nil)
	case "capture":
		stop, err = startRecvLogical(ctx, e, s)
		slot = true
	}
	if err != nil {
		return r, err
	}
	defer func() {
		_ = stop()
		if slot {
			// The slot outlives its reader: drop it, or it holds WAL for the
			// rest of the run.
			_, _ = e.admin.Exec(context.WithoutCancel(ctx), "SELECT pg_drop_replication_slot($1)", outboxcdc.SlotName(s.schema, outboxcdc.GroupDefault))
		}
	}()
	if _, _, err := closedLoop(ctx, wpool, 16, 300*time.Millisecond, k.libEvent, nil); err != nil {
		return r, err
	}
	var from time.Time
	if err := e.admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&from); err != nil {
		return r, err
	}
	t := time.Now()
	r.n, _, err = closedLoop(ctx, wpool, 16, e.sz.notifyWriteDur, k.libEvent, nil)
	r.d = time.Since(t)
	if err != nil {
		return r, err
	}
	err = e.admin.QueryRow(ctx, `SELECT count(*) FROM `+s.schema+`.outbox_events WHERE published_at >= $1 AND published_at <= clock_timestamp()`, from).Scan(&r.published)
	return r, err
}

// startRecvLogical creates the space's publication and slot and streams the
// slot with pg_recvlogical to /dev/null: the server's decoding and sending,
// with no relay behind it.
func startRecvLogical(ctx context.Context, e *env, s space) (func() error, error) {
	if err := outboxcdc.Setup(ctx, outboxcdc.Config{Pool: e.admin, Schema: s.schema}); err != nil {
		return nil, err
	}
	tool, err := pgcluster.Tool("pg_recvlogical")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(tool, "--dbname", e.o.databaseURL, "--slot", outboxcdc.SlotName(s.schema, outboxcdc.GroupDefault), "--start",
		"-o", "proto_version=1", "-o", "publication_names="+outboxcdc.PublicationName(s.schema), "--file", "/dev/null", "--fsync-interval", "1")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() error {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil
	}, nil
}

// drainCDC starts a CDC relay (the stream alone, no safety net) on space s,
// whose slot holds a backlog of n events, and returns how long it took to
// publish them all.
func drainCDC(ctx context.Context, e *env, s space, n int, label string) (time.Duration, error) {
	pub, nc, err := e.publisher(ctx, s)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	pool, err := e.relayPool(ctx, 6)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	ph := &phases{}
	ids, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: s.schema, Publisher: pub, Logger: quietLogger(), ID: "bench-cdc-drain", DisableNotify: true, Observer: ph})
	if err != nil {
		return 0, err
	}
	c, err := outboxcdc.New(outboxcdc.Config{DatabaseURL: e.o.databaseURL, Pool: pool, Schema: s.schema, Relay: ids, Logger: quietLogger()})
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(runCtx) }()
	var read time.Duration // until the stream had received every id
	for c.Stats().Published() < int64(n) && time.Since(start) < 10*time.Minute && ctx.Err() == nil {
		if read == 0 && c.Stats().Received() >= int64(n) {
			read = time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cdcDur := time.Since(start)
	e.logf("%s: PublishIDs %s", label, ph.String(cdcDur))
	e.logf("%s: every id received from the slot after %s", label, read.Round(time.Millisecond))
	cancel()
	<-done
	if got := c.Stats().Published(); got < int64(n) {
		return 0, fmt.Errorf("cdc drained %d of %d events", got, n)
	}
	return cdcDur, nil
}
