package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
)

// soakSizes shape the soak group.
type soakSizes struct {
	duration    time.Duration // writers and relay together
	rate        int           // events/s offered, one event per transaction
	interval    time.Duration // one table row per interval
	retention   time.Duration // the relay's clean-up horizon
	aggregates  int           // events spread over this many aggregates
	vacuumEvery time.Duration // when positive, VACUUM (ANALYZE) the outbox tables this often (a cron job where autovacuum is off)
	// relayVacuum is the relay's VacuumInterval (0: the default; negative:
	// the relay never vacuums, as before it learnt to).
	relayVacuum time.Duration
}

func defaultSoak() soakSizes {
	return soakSizes{duration: 10 * time.Minute, rate: 1000, interval: time.Minute, retention: time.Minute, aggregates: 10_000}
}

func quickSoak() soakSizes {
	return soakSizes{duration: 6 * time.Second, rate: 500, interval: 2 * time.Second, retention: 2 * time.Second, aggregates: 1000}
}

// override returns s with o's non-zero fields (the command line's) in place.
func (s soakSizes) override(o soakSizes) soakSizes {
	if o.duration > 0 {
		s.duration = o.duration
	}
	if o.rate > 0 {
		s.rate = o.rate
	}
	if o.interval > 0 {
		s.interval = o.interval
	}
	if o.retention > 0 {
		s.retention = o.retention
	}
	if o.aggregates > 0 {
		s.aggregates = o.aggregates
	}
	if o.vacuumEvery > 0 {
		s.vacuumEvery = o.vacuumEvery
	}
	if o.relayVacuum != 0 {
		s.relayVacuum = o.relayVacuum
	}
	return s
}

// soakObserver collects, per interval, what the relay did: the lag of each
// acknowledged event, claim round trips and clean-up deletions.
type soakObserver struct {
	mu        sync.Mutex
	lags      []time.Duration
	published int64
	claims    int
	claimTime time.Duration
	deleted   int64
}

var (
	_ outbox.ClaimObserver   = (*soakObserver)(nil)
	_ outbox.PublishObserver = (*soakObserver)(nil)
	_ outbox.CleanupObserver = (*soakObserver)(nil)
)

func (o *soakObserver) ObservePublish(p outbox.PublishObservation) {
	if p.Err != nil {
		return
	}
	o.mu.Lock()
	o.lags = append(o.lags, p.CommitToAck)
	o.published++
	o.mu.Unlock()
}

func (o *soakObserver) ObserveClaim(c outbox.ClaimObservation) {
	o.mu.Lock()
	o.claims++
	o.claimTime += c.Duration
	o.mu.Unlock()
}

func (o *soakObserver) ObserveCleanup(c outbox.CleanupObservation) {
	if c.Table != "outbox_events" {
		return
	}
	o.mu.Lock()
	o.deleted += int64(c.Deleted)
	o.mu.Unlock()
}

// take returns what was observed since the last call and starts afresh.
func (o *soakObserver) take() (lags []time.Duration, published int64, claims int, claimTime time.Duration, deleted int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	lags, published, claims, claimTime, deleted = o.lags, o.published, o.claims, o.claimTime, o.deleted
	o.lags, o.published, o.claims, o.claimTime, o.deleted = nil, 0, 0, 0, 0
	return
}

// tableStats is a table's size and what pg_stat_user_tables says of it.
type tableStats struct {
	bytes                int64 // pg_total_relation_size: heap, indexes, TOAST
	live, dead           int64
	autovacuums, vacuums int64
	updates, hotUpdates  int64
	lastAutovacuum       string
}

func (e *env) tableStats(ctx context.Context, schema, table string) (tableStats, error) {
	var t tableStats
	err := e.admin.QueryRow(ctx, `SELECT pg_total_relation_size(relid), n_live_tup, n_dead_tup, autovacuum_count, vacuum_count,
	n_tup_upd, n_tup_hot_upd, coalesce(to_char(last_autovacuum, 'HH24:MI:SS'), '-')
FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(
		&t.bytes, &t.live, &t.dead, &t.autovacuums, &t.vacuums, &t.updates, &t.hotUpdates, &t.lastAutovacuum)
	if err != nil {
		return t, fmt.Errorf("statistics of %s.%s: %w", schema, table, err)
	}
	return t, nil
}

// soakRow is one interval of the soak.
type soakRow struct {
	end                 time.Duration // since the load started
	written, published  float64       // events/s
	deleted             float64       // clean-up deletions/s
	p50, p99, max       float64       // ms, occurred_at to the broker's ack
	pending             int64         // unpublished at the end
	claimMs             float64       // mean claim round trip
	events, aggs        tableStats    // at the end
	hotPct, aggHotPct   float64       // HOT share of the interval's updates
	load                string        // the machine's 1-minute load average
	eventsMB, eventsMax float64
}

const soakHeader = "| at | written/s | published/s | lag p50 ms | lag p99 ms | lag max ms | pending | claim ms | outbox_events MB | live | dead | HOT % | autovacuums | last autovacuum | manual vacuums | counters dead | counters autovacuums | deleted/s | load |"

func (r soakRow) String() string {
	at := r.end.Round(time.Second)
	return fmt.Sprintf("| %d:%02d | %.0f | %.0f | %.1f | %.1f | %.0f | %d | %.2f | %.1f | %d | %d | %.0f | %d | %s | %d | %d | %d | %.0f | %s |",
		int(at.Minutes()), int(at.Seconds())%60, r.written, r.published, r.p50, r.p99, r.max, r.pending, r.claimMs, r.eventsMB,
		r.events.live, r.events.dead, r.hotPct, r.events.autovacuums, r.events.lastAutovacuum, r.events.vacuums, r.aggs.dead, r.aggs.autovacuums, r.deleted, r.load)
}

// serverVacuumSettings describes the server's autovacuum settings.
func (e *env) serverVacuumSettings(ctx context.Context) string {
	rows, err := e.admin.Query(ctx, `SELECT name, current_setting(name) FROM pg_settings
WHERE name IN ('autovacuum', 'autovacuum_naptime', 'autovacuum_vacuum_cost_limit', 'autovacuum_vacuum_cost_delay',
	'autovacuum_max_workers', 'shared_buffers', 'synchronous_commit', 'port') ORDER BY name`)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return err.Error()
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, " ")
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "-"
	}
	return strings.Fields(string(b))[0]
}

// benchSoak runs writers and a relay together at a steady offered rate for
// a long time, with the relay's periodic clean-up on, and prints one row per
// interval: throughput, lag, the outbox table's size, live and dead rows and
// autovacuum runs. What it shows is whether the system stays flat as the
// table churns, with the vacuum settings of the server it runs on.
func benchSoak(ctx context.Context, e *env) ([]Result, error) {
	sz := e.sz.soak
	s, cleanup, err := e.newSpace(ctx, "soak")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	var reloptions string
	_ = e.admin.QueryRow(ctx, "SELECT coalesce(array_to_string(reloptions, ' '), 'defaults') FROM pg_class WHERE oid = $1::regclass",
		s.schema+".outbox_events").Scan(&reloptions)
	server := e.serverVacuumSettings(ctx)
	e.logf("soak: %d events/s for %s over %d aggregates; relay clean-up keeps %s; a row every %s", sz.rate, sz.duration, sz.aggregates, sz.retention, sz.interval)
	e.logf("soak: server %s", server)
	e.logf("soak: outbox_events %s", reloptions)

	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	if err != nil {
		return nil, err
	}
	wpool, err := e.pool(ctx, 16)
	if err != nil {
		return nil, err
	}
	defer wpool.Close()
	obs := &soakObserver{}
	cleanEvery := min(10*time.Second, max(sz.retention/6, time.Second))
	r, stopRelay, err := startRelay(ctx, e, s, outbox.RelayConfig{Observer: obs,
		Cleanup: outbox.CleanupConfig{OlderThan: sz.retention}, CleanupInterval: cleanEvery, VacuumInterval: sz.relayVacuum}, nil)
	if err != nil {
		return nil, err
	}
	relayStopped := false
	defer func() {
		if !relayStopped {
			_ = stopRelay()
		}
	}()
	notifier, err := outbox.NewNotifier(wpool, outbox.NotifierConfig{Schema: s.schema, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	defer notifier.Close()

	if sz.vacuumEvery > 0 {
		e.logf("soak: VACUUM (ANALYZE) of outbox_events and outbox_aggregates every %s", sz.vacuumEvery)
		vctx, stopVacuum := context.WithCancel(ctx)
		vdone := make(chan struct{})
		go func() {
			defer close(vdone)
			t := time.NewTicker(sz.vacuumEvery)
			defer t.Stop()
			for {
				select {
				case <-vctx.Done():
					return
				case <-t.C:
				}
				start := time.Now()
				if _, err := e.admin.Exec(vctx, "VACUUM (ANALYZE) "+s.schema+".outbox_events, "+s.schema+".outbox_aggregates"); err != nil && vctx.Err() == nil {
					e.logf("soak: vacuum: %v", err)
				} else if err == nil {
					e.logf("soak: vacuum took %s", time.Since(start).Round(time.Millisecond))
				}
			}
		}()
		defer func() { stopVacuum(); <-vdone }()
	}

	// Each transaction writes one event to a random aggregate of the pool:
	// the counter row is updated (not inserted) once the pool is warm, as in
	// a service whose orders get several events each.
	var written atomic.Int64
	write := func() error {
		agg := fmt.Sprintf("soak-%d", rand.IntN(sz.aggregates))
		err := pgx.BeginFunc(ctx, wpool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: agg, Type: "OrderUpdated", Payload: []byte(payload)})
			return err
		})
		if err != nil {
			return err
		}
		written.Add(1)
		notifier.Notify()
		return nil
	}

	type loadResult struct {
		sent    int
		elapsed time.Duration
		err     error
	}
	loadDone := make(chan loadResult, 1)
	go func() {
		sent, elapsed, err := offerLoad(ctx, sz.rate, sz.duration, 16, write)
		loadDone <- loadResult{sent, elapsed, err}
	}()

	start := time.Now()
	nrows := int((sz.duration + sz.interval - 1) / sz.interval)
	rows := make([]soakRow, 0, nrows)
	prevEvents, err := e.tableStats(ctx, s.schema, "outbox_events")
	if err != nil {
		return nil, err
	}
	prevAggs, err := e.tableStats(ctx, s.schema, "outbox_aggregates")
	if err != nil {
		return nil, err
	}
	var prevWritten int64
	prevAt := start
	progressEvery := min(10*time.Second, sz.interval)
	progress := time.NewTicker(progressEvery)
	defer progress.Stop()
	var totalPublished int64
	for len(rows) < nrows {
		next := start.Add(time.Duration(len(rows)+1) * sz.interval)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-progress.C:
			if time.Until(next) > progressEvery/2 {
				pending, _ := e.unpublished(ctx, s.schema)
				e.logf("soak %s: written %d, published %d, pending %d", time.Since(start).Round(time.Second),
					written.Load(), r.Stats().Published, pending)
			}
			continue
		case <-time.After(time.Until(next)):
		}
		now := time.Now()
		secs := now.Sub(prevAt).Seconds()
		lags, published, claims, claimTime, deleted := obs.take()
		totalPublished += published
		wr := written.Load()
		row := soakRow{end: now.Sub(start), written: float64(wr-prevWritten) / secs, published: float64(published) / secs,
			deleted: float64(deleted) / secs, load: loadAvg()}
		row.p50, row.p99, row.max = percentiles(lags)
		if claims > 0 {
			row.claimMs = ms(claimTime) / float64(claims)
		}
		if row.pending, err = e.unpublished(ctx, s.schema); err != nil {
			return nil, err
		}
		if row.events, err = e.tableStats(ctx, s.schema, "outbox_events"); err != nil {
			return nil, err
		}
		if row.aggs, err = e.tableStats(ctx, s.schema, "outbox_aggregates"); err != nil {
			return nil, err
		}
		row.eventsMB = float64(row.events.bytes) / (1 << 20)
		row.hotPct = hotShare(prevEvents, row.events)
		row.aggHotPct = hotShare(prevAggs, row.aggs)
		if len(rows) == 0 {
			e.logf("soak: %s", soakHeader)
		}
		e.logf("soak: %s", row)
		rows = append(rows, row)
		prevEvents, prevAggs, prevWritten, prevAt = row.events, row.aggs, wr, now
	}
	lr := <-loadDone
	if lr.err != nil {
		return nil, fmt.Errorf("writers: %w", lr.err)
	}
	// Let the relay publish what is left, then check nothing was lost. A
	// relay that fell behind is reported (how long it took, or how much was
	// left after two minutes), not treated as an error: the table is the
	// point of the run.
	drainStart := time.Now()
	var left int64
	for {
		if left, err = e.unpublished(ctx, s.schema); err != nil {
			return nil, err
		}
		if left == 0 || time.Since(drainStart) > 2*time.Minute {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return nil, err
		}
	}
	drained := time.Since(drainStart)
	relayStopped = true
	if err := stopRelay(); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if pub := r.Stats().Published; left == 0 && pub < written.Load() {
		return nil, fmt.Errorf("relay published %d events, writers committed %d", pub, written.Load())
	}
	e.logf("soak: offered %d events in %s (%.0f/s), committed %d, relay published %d; %d left unpublished %s after the load ended",
		lr.sent, lr.elapsed.Round(time.Millisecond), float64(lr.sent)/lr.elapsed.Seconds(), written.Load(), r.Stats().Published,
		left, drained.Round(time.Millisecond))

	// The table again, in one piece, for BENCHMARKS.md.
	manual := "no manual VACUUM"
	if sz.vacuumEvery > 0 {
		manual = "VACUUM (ANALYZE) every " + sz.vacuumEvery.String()
	}
	if sz.relayVacuum < 0 {
		manual += ", the relay's own vacuum off"
	} else {
		manual += ", the relay vacuums where autovacuum is off"
	}
	fmt.Fprintf(e.logw, "\nsoak: %d events/s offered for %s, clean-up keeps %s, %s; server: %s; outbox_events: %s\n\n%s\n%s\n",
		sz.rate, sz.duration, sz.retention, manual, server, reloptions, soakHeader, soakDivider())
	for _, row := range rows {
		fmt.Fprintln(e.logw, row)
	}
	fmt.Fprintln(e.logw)
	return append(soakResults(rows, sz, server), Result{Scenario: "soak/drain-after-load", Seconds: drained.Seconds(),
		Value: f(float64(left)), Unit: "left", Target: "0 left", Met: b(left == 0),
		Note: "time for the relay to publish what was pending when the writers stopped, and what was still pending after two minutes"}), nil
}

func hotShare(prev, cur tableStats) float64 {
	upd := cur.updates - prev.updates
	if upd <= 0 {
		return 0
	}
	return 100 * float64(cur.hotUpdates-prev.hotUpdates) / float64(upd)
}

func soakDivider() string {
	return strings.Repeat("|---", strings.Count(soakHeader, "|")-1) + "|"
}

// soakResults summarises the soak: the first and last intervals, and the
// ratios that say whether it stayed flat. The size is compared between the
// middle and the last interval: the table grows from empty until the
// clean-up horizon is reached, which takes the first interval or two.
func soakResults(rows []soakRow, sz soakSizes, server string) []Result {
	if len(rows) == 0 {
		return nil
	}
	first, last, mid := rows[0], rows[len(rows)-1], rows[(len(rows)-1)/2]
	row := func(name string, r soakRow) Result {
		return Result{Scenario: name, EventsPerSec: f(r.published), P50: f(r.p50), P99: f(r.p99), Max: f(r.max),
			Value: f(r.eventsMB), Unit: "MB", Seconds: r.end.Seconds(),
			Note: fmt.Sprintf("written %.0f/s, outbox_events live %d dead %d, %d autovacuums, claim %.2f ms",
				r.written, r.events.live, r.events.dead, r.events.autovacuums, r.claimMs)}
	}
	ratio := func(name string, v float64, of, target string, met bool) Result {
		return Result{Scenario: name, Ratio: f(v), RatioOf: of, Target: target, Met: b(met)}
	}
	pub := last.published / first.published
	wr := last.written / first.written
	p50 := last.p50 / first.p50
	p99 := last.p99 / first.p99
	size := last.eventsMB / mid.eventsMB
	return []Result{
		row("soak/first-interval", first),
		row("soak/last-interval", last),
		ratio("soak/written-last-vs-first", wr, "soak/first-interval", ">= 0.95", wr >= 0.95),
		ratio("soak/published-last-vs-first", pub, "soak/first-interval", ">= 0.95", pub >= 0.95),
		ratio("soak/lag-p50-last-vs-first", p50, "soak/first-interval", "<= 1.5", p50 <= 1.5),
		ratio("soak/lag-p99-last-vs-first", p99, "soak/first-interval", "<= 1.5", p99 <= 1.5),
		ratio("soak/size-last-vs-middle", size, fmt.Sprintf("soak interval %d", (len(rows)-1)/2+1), "<= 1.10", size <= 1.10),
		{Scenario: "soak/dead-tuples-last", Value: f(float64(last.events.dead)), Unit: "rows",
			Note: fmt.Sprintf("%d events/s for %s, clean-up keeps %s; %s", sz.rate, sz.duration, sz.retention, server)},
	}
}
