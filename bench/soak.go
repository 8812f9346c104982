package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// The soak's outbox kinds (--soak-outboxes): the plain table, whose
// clean-up DELETEs settled events, and the partitioned one
// (outboxmigrate.Partition), whose upkeep drops settled partitions.
const (
	soakDelete      = "delete"
	soakPartitioned = "partitioned"
)

var soakOutboxKinds = []string{soakDelete, soakPartitioned}

// The soak's servers (--soak-autovacuum): a private cluster with autovacuum
// off or on, or the server of --database-url as it is configured.
const (
	soakAVOff    = "off"
	soakAVOn     = "on"
	soakAVServer = "server"
)

var soakAutovacuums = []string{soakAVOff, soakAVOn, soakAVServer}

// soakSizes shape the soak group.
type soakSizes struct {
	duration    time.Duration // writers and relay together
	rate        int           // events/s offered, one event per transaction
	interval    time.Duration // one table row per interval
	retention   time.Duration // the relay's clean-up horizon (the replay horizon)
	aggregates  int           // events spread over this many aggregates
	vacuumEvery time.Duration // when positive, VACUUM (ANALYZE) the outbox tables this often (a cron job where autovacuum is off)
	// relayVacuum is the relay's VacuumInterval (0: the default for the
	// kind: the library's on the DELETE path, off on the partitioned one,
	// whose target is "no VACUUM of the outbox table by anyone"; negative:
	// the relay never vacuums).
	relayVacuum time.Duration
	// window is the span compared: the first window against the last (the
	// rate), the second against the last (the size, the claim); 0: a
	// sixth of the duration (5 minutes of 30).
	window time.Duration
	// outboxes are the kinds run, one after the other (soakOutboxKinds).
	outboxes []string
	// autovacuum are the servers run on, one after the other
	// (soakAutovacuums); every kind runs on each.
	autovacuum []string
	// partitionInterval is the partitioned outbox's partition width.
	partitionInterval time.Duration
	// partitionsAhead is how many partitions are kept ready after the
	// current one (0: the library's, 6).
	partitionsAhead int
}

// lineBuf keeps the lines a relay logs until the soak's loop prints them
// (in its own goroutine, the only one writing to the log).
type lineBuf struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		l.lines = append(l.lines, s)
	}
	return len(p), nil
}

func (l *lineBuf) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

func defaultSoak() soakSizes {
	return soakSizes{duration: 10 * time.Minute, rate: 1000, interval: time.Minute, retention: time.Minute, aggregates: 10_000,
		outboxes: soakOutboxKinds, autovacuum: []string{soakAVOff, soakAVOn}, partitionInterval: time.Minute}
}

func quickSoak() soakSizes {
	return soakSizes{duration: 6 * time.Second, rate: 500, interval: 2 * time.Second, retention: 2 * time.Second, aggregates: 1000,
		outboxes: soakOutboxKinds, autovacuum: []string{soakAVOff}, partitionInterval: time.Second, partitionsAhead: 20}
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
	if o.window > 0 {
		s.window = o.window
	}
	if len(o.outboxes) > 0 {
		s.outboxes = o.outboxes
	}
	if len(o.autovacuum) > 0 {
		s.autovacuum = o.autovacuum
	}
	if o.partitionInterval > 0 {
		s.partitionInterval = o.partitionInterval
	}
	if o.partitionsAhead > 0 {
		s.partitionsAhead = o.partitionsAhead
	}
	return s
}

// windowOf is the span the soak's summary compares.
func (s soakSizes) windowOf() time.Duration {
	if s.window > 0 {
		return s.window
	}
	return max(s.duration/6, s.interval)
}

// parseSoakList parses a comma-separated list of allowed values.
func parseSoakList(flagName, v string, allowed []string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var out []string
	for _, x := range strings.Split(v, ",") {
		if !slices.Contains(allowed, x) {
			return nil, fmt.Errorf("--%s: unknown %q (one or more of %s)", flagName, x, strings.Join(allowed, ","))
		}
		out = append(out, x)
	}
	return out, nil
}

// soakObserver collects, per interval, what the relay did: the lag of each
// acknowledged event, claim round trips and clean-up deletions.
type soakObserver struct {
	mu        sync.Mutex
	lags      []time.Duration
	published int64
	claims    []time.Duration
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
	o.claims = append(o.claims, c.Duration)
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
func (o *soakObserver) take() (lags []time.Duration, published int64, claims []time.Duration, deleted int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	lags, published, claims, deleted = o.lags, o.published, o.claims, o.deleted
	o.lags, o.published, o.claims, o.deleted = nil, 0, nil, 0
	return
}

// tableStats is a table's size and what pg_stat_user_tables says of it;
// for a partitioned table, summed over its partitions.
type tableStats struct {
	bytes                int64 // pg_total_relation_size: heap, indexes, TOAST
	indexBytes           int64 // pg_indexes_size
	live, dead           int64
	autovacuums, vacuums int64
	updates, hotUpdates  int64
	parts                int // partitions (1 for a plain table)
	lastAutovacuum       string
}

// treeStats sums table's statistics over the leaves of its partition tree
// (the table itself when it is not partitioned). seen keeps, per leaf, the
// highest vacuum and update counts read: the counts of a partition vanish
// when it is dropped, and the soak counts every vacuum of the outbox table
// and the HOT share of every interval's updates.
func (e *env) treeStats(ctx context.Context, schema, table string, seen map[string][4]int64) (tableStats, error) {
	var t tableStats
	rows, err := e.admin.Query(ctx, `WITH leaves AS (
	SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
	UNION SELECT $1::regclass WHERE (SELECT relkind FROM pg_class WHERE oid = $1::regclass) = 'r')
SELECT s.relname, pg_total_relation_size(s.relid), pg_indexes_size(s.relid), n_live_tup, n_dead_tup, autovacuum_count, vacuum_count,
	n_tup_upd, n_tup_hot_upd, coalesce(to_char(last_autovacuum, 'HH24:MI:SS'), '-')
FROM leaves l JOIN pg_stat_user_tables s ON s.relid = l.relid`, schema+"."+table)
	if err != nil {
		return t, fmt.Errorf("statistics of %s.%s: %w", schema, table, err)
	}
	defer rows.Close()
	t.lastAutovacuum = "-"
	for rows.Next() {
		var name, last string
		var bytes, idx, live, dead, av, v, upd, hot int64
		if err := rows.Scan(&name, &bytes, &idx, &live, &dead, &av, &v, &upd, &hot, &last); err != nil {
			return t, err
		}
		t.bytes += bytes
		t.indexBytes += idx
		t.live += live
		t.dead += dead
		t.parts++
		if last != "-" && (t.lastAutovacuum == "-" || last > t.lastAutovacuum) {
			t.lastAutovacuum = last
		}
		if seen != nil {
			p := seen[name]
			seen[name] = [4]int64{max(p[0], av), max(p[1], v), max(p[2], upd), max(p[3], hot)}
		} else {
			t.autovacuums += av
			t.vacuums += v
			t.updates += upd
			t.hotUpdates += hot
		}
	}
	if err := rows.Err(); err != nil {
		return t, fmt.Errorf("statistics of %s.%s: %w", schema, table, err)
	}
	for _, c := range seen {
		t.autovacuums += c[0]
		t.vacuums += c[1]
		t.updates += c[2]
		t.hotUpdates += c[3]
	}
	return t, nil
}

// soakRow is one interval of the soak.
type soakRow struct {
	end                time.Duration // since the load started
	secs               float64       // the interval's length
	written, published float64       // events/s
	deleted            float64       // clean-up deletions/s
	p50, p99, max      float64       // ms, occurred_at to the broker's ack
	pending            int64         // unpublished at the end
	claimMs, claimP99  float64       // claim round trip: mean, p99
	events, aggs       tableStats    // at the end
	hotPct             float64       // HOT share of the interval's updates of outbox_events
	walBytes           int64         // WAL written in the interval (the whole cluster's)
	load               string        // the machine's 1-minute load average
	eventsMB, indexMB  float64
}

const soakHeader = "| at | written/s | published/s | lag p50 ms | lag p99 ms | lag max ms | pending | claim ms | claim p99 ms | outbox_events MB (table+indexes) | indexes MB | partitions | live | dead | HOT % | autovacuums | last autovacuum | manual vacuums | counters dead | counters autovacuums | deleted/s | WAL MB | load |"

func (r soakRow) String() string {
	at := r.end.Round(time.Second)
	return fmt.Sprintf("| %d:%02d | %.0f | %.0f | %.1f | %.1f | %.0f | %d | %.2f | %.2f | %.1f | %.1f | %d | %d | %d | %.0f | %d | %s | %d | %d | %d | %.0f | %.1f | %s |",
		int(at.Minutes()), int(at.Seconds())%60, r.written, r.published, r.p50, r.p99, r.max, r.pending, r.claimMs, r.claimP99, r.eventsMB,
		r.indexMB, r.events.parts, r.events.live, r.events.dead, r.hotPct, r.events.autovacuums, r.events.lastAutovacuum, r.events.vacuums,
		r.aggs.dead, r.aggs.autovacuums, r.deleted, float64(r.walBytes)/(1<<20), r.load)
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

// soakCluster starts the private cluster of one --soak-autovacuum value:
// PostgreSQL's default settings but autovacuum (as pressureCluster sets
// them: max_connections 100, shared_buffers 128MB), with
// pg_stat_statements, and an env on it.
func soakCluster(ctx context.Context, e *env, autovacuum string) (*env, *pgcluster.Cluster, func(), error) {
	return soakClusterWith(ctx, e, soakSettings(autovacuum))
}

// soakSettings are soakCluster's server settings.
func soakSettings(autovacuum string) map[string]string {
	return map[string]string{"max_connections": "100", "shared_buffers": "128MB",
		"shared_preload_libraries": "pg_stat_statements", "autovacuum": autovacuum}
}

// soakClusterWith is soakCluster with the server settings given.
func soakClusterWith(ctx context.Context, e *env, settings map[string]string) (*env, *pgcluster.Cluster, func(), error) {
	cluster, err := pgcluster.Start(pgcluster.Config{Settings: settings})
	if err != nil {
		return nil, nil, nil, err
	}
	o := e.o
	o.databaseURL = cluster.URL("")
	ce, err := newEnv(ctx, o, e.logw)
	if err != nil {
		_ = cluster.Close()
		return nil, nil, nil, err
	}
	if _, err := ce.admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		ce.close()
		_ = cluster.Close()
		return nil, nil, nil, err
	}
	return ce, cluster, func() { ce.close(); _ = cluster.Close() }, nil
}

// soakOutcome is one combination's run: its rows and what the summary
// needs.
type soakOutcome struct {
	kind, autovacuum string
	server, relayVac string
	rows             []soakRow
	written          int64 // during the load
	walBytes         int64 // during the load
	cpu              time.Duration
	cpuKnown         bool
	stmts            map[string]stmtGroup // pg_stat_statements, during the load
	left             int64
	drained          time.Duration
	dropped          int // partitions dropped
}

// benchSoak runs writers and a relay together at a steady offered rate for
// a long time, with the relay's periodic clean-up on, for each outbox kind
// on each server of --soak-autovacuum, one combination at a time (the WAL
// and the CPU are the cluster's), and prints one row per interval
// (throughput, lag, the outbox table's size, live and dead rows and
// vacuums) and a summary of every combination side by side. What it shows
// is whether the system stays flat as the table churns, and what the
// DELETE clean-up costs beside dropping partitions.
func benchSoak(ctx context.Context, e *env) ([]Result, error) {
	sz := e.sz.soak
	var outs []*soakOutcome
	var runErr error
	onServer := func(av string) error {
		se, dataDir := e, ""
		if av != soakAVServer {
			ce, cluster, closeCluster, err := soakCluster(ctx, e, av)
			if err != nil {
				return fmt.Errorf("private cluster (autovacuum %s): %w", av, err)
			}
			defer closeCluster()
			se, dataDir = ce, cluster.DataDir()
			e.logf("soak: private cluster on port %d, autovacuum %s", cluster.Port(), av)
		}
		for _, kind := range sz.outboxes {
			if se.sz.checkpoint {
				if _, err := se.admin.Exec(ctx, "CHECKPOINT"); err != nil {
					e.logf("checkpoint: %v", err)
				}
			}
			out, err := soakOne(ctx, se, kind, av, dataDir)
			if out != nil {
				outs = append(outs, out)
			}
			if err != nil {
				return fmt.Errorf("%s, autovacuum %s: %w", kind, av, err)
			}
		}
		return nil
	}
	for _, av := range sz.autovacuum {
		if runErr = onServer(av); runErr != nil {
			break
		}
	}
	var results []Result
	for _, o := range outs {
		results = append(results, soakResults(o, sz)...)
	}
	if len(outs) > 0 {
		fmt.Fprintf(e.logw, "\n%s\n", soakSummary(outs, sz))
		results = append(results, soakWALRatios(outs)...)
	}
	return results, runErr
}

// soakOne runs one combination on se's server: a schema of its own,
// partitioned when kind says so, writers, a relay, a row every interval.
func soakOne(ctx context.Context, se *env, kind, av, dataDir string) (*soakOutcome, error) {
	sz := se.sz.soak
	s, cleanup, err := se.newSpace(ctx, "soak_"+kind)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	relayVac := sz.relayVacuum
	if relayVac == 0 && kind == soakPartitioned {
		relayVac = -1
	}
	if kind == soakPartitioned {
		res, err := outboxmigrate.Partition(ctx, se.admin, s.schema, outboxmigrate.PartitionConfig{Interval: sz.partitionInterval, Ahead: sz.partitionsAhead})
		if err != nil {
			return nil, fmt.Errorf("partition: %w", err)
		}
		se.logf("soak: outbox_events partitioned by %s, %d partitions created", sz.partitionInterval, len(res.Created))
	}
	// The storage parameters of the table, or of its newest partition
	// (a partitioned table has none; its partitions carry the table's).
	var reloptions string
	_ = se.admin.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ' '), 'defaults') FROM pg_class
WHERE oid = coalesce((SELECT max(relid::regclass::text)::regclass FROM pg_partition_tree($1::regclass) WHERE isleaf), $1::regclass)`,
		s.schema+".outbox_events").Scan(&reloptions)
	out := &soakOutcome{kind: kind, autovacuum: av, server: se.serverVacuumSettings(ctx)}
	switch {
	case relayVac < 0:
		out.relayVac = "the relay's VACUUM off"
	case relayVac == 0:
		out.relayVac = "the relay vacuums every " + outbox.VacuumIntervalDefault.String() + " where autovacuum is off"
	default:
		out.relayVac = "the relay vacuums every " + relayVac.String() + " where autovacuum is off"
	}
	se.logf("soak %s/%s: %d events/s for %s over %d aggregates; relay clean-up keeps %s; a row every %s; %s",
		kind, av, sz.rate, sz.duration, sz.aggregates, sz.retention, sz.interval, out.relayVac)
	se.logf("soak: server %s", out.server)
	se.logf("soak: outbox_events %s", reloptions)

	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	if err != nil {
		return nil, err
	}
	wpool, err := se.pool(ctx, 16)
	if err != nil {
		return nil, err
	}
	defer wpool.Close()
	obs := &soakObserver{}
	cleanEvery := min(10*time.Second, max(sz.retention/6, time.Second))
	relayLog := &lineBuf{}
	r, stopRelay, err := startRelay(ctx, se, s, outbox.RelayConfig{Observer: obs,
		Cleanup: outbox.CleanupConfig{OlderThan: sz.retention}, CleanupInterval: cleanEvery, VacuumInterval: relayVac,
		PartitionsAhead: sz.partitionsAhead, Logger: slog.New(slog.NewTextHandler(relayLog, nil))}, nil)
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
		se.logf("soak: VACUUM (ANALYZE) of outbox_events and outbox_aggregates every %s", sz.vacuumEvery)
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
				if _, err := se.admin.Exec(vctx, "VACUUM (ANALYZE) "+s.schema+".outbox_events, "+s.schema+".outbox_aggregates"); err != nil && vctx.Err() == nil {
					se.logf("soak: vacuum: %v", err)
				} else if err == nil {
					se.logf("soak: vacuum took %s", time.Since(start).Round(time.Millisecond))
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

	// The figures per event start here: pg_stat_statements and the
	// server's CPU and WAL.
	pgss := se.resetStatements(ctx)
	cpu0, cpuOK := clusterCPU(dataDir)
	lsn0, err := se.walLSN(ctx)
	if err != nil {
		return nil, err
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
	seen := map[string][4]int64{}
	prevEvents, err := se.treeStats(ctx, s.schema, "outbox_events", seen)
	if err != nil {
		return nil, err
	}
	prevAggs, err := se.treeStats(ctx, s.schema, "outbox_aggregates", nil)
	if err != nil {
		return nil, err
	}
	parts := map[string]bool{}
	if ps, err := se.partitionNames(ctx, s.schema); err == nil {
		for _, p := range ps {
			parts[p] = true
		}
	}
	var prevWritten int64
	prevAt, prevLSN := start, lsn0
	progressEvery := min(10*time.Second, sz.interval)
	progress := time.NewTicker(progressEvery)
	defer progress.Stop()
	for len(rows) < nrows {
		// The last row ends with the load, when the duration is not a
		// multiple of the interval.
		next := start.Add(min(time.Duration(len(rows)+1)*sz.interval, sz.duration))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-progress.C:
			if time.Until(next) > progressEvery/2 {
				pending, _ := se.unpublished(ctx, s.schema)
				se.logf("soak %s: written %d, published %d, pending %d", time.Since(start).Round(time.Second),
					written.Load(), r.Stats().Published, pending)
			}
			continue
		case <-time.After(time.Until(next)):
		}
		now := time.Now()
		secs := now.Sub(prevAt).Seconds()
		lags, published, claims, deleted := obs.take()
		wr := written.Load()
		row := soakRow{end: now.Sub(start), secs: secs, written: float64(wr-prevWritten) / secs, published: float64(published) / secs,
			deleted: float64(deleted) / secs, load: loadAvg()}
		row.p50, row.p99, row.max = percentiles(lags)
		if len(claims) > 0 {
			var sum time.Duration
			for _, c := range claims {
				sum += c
			}
			row.claimMs = ms(sum) / float64(len(claims))
			_, row.claimP99, _ = percentiles(claims)
		}
		if row.pending, err = se.unpublished(ctx, s.schema); err != nil {
			return nil, err
		}
		if row.events, err = se.treeStats(ctx, s.schema, "outbox_events", seen); err != nil {
			return nil, err
		}
		if row.aggs, err = se.treeStats(ctx, s.schema, "outbox_aggregates", nil); err != nil {
			return nil, err
		}
		lsn, err := se.walLSN(ctx)
		if err != nil {
			return nil, err
		}
		row.walBytes, prevLSN = lsn-prevLSN, lsn
		if ps, err := se.partitionNames(ctx, s.schema); err == nil {
			now := map[string]bool{}
			for _, p := range ps {
				now[p] = true
			}
			for p := range parts {
				if !now[p] {
					out.dropped++
				}
			}
			parts = now
		}
		row.eventsMB = float64(row.events.bytes) / (1 << 20)
		row.indexMB = float64(row.events.indexBytes) / (1 << 20)
		row.hotPct = hotShare(prevEvents, row.events)
		for _, l := range relayLog.take() {
			se.logf("soak: relay: %s", l)
		}
		if len(rows) == 0 {
			se.logf("soak: %s", soakHeader)
		}
		se.logf("soak: %s", row)
		rows = append(rows, row)
		prevEvents, prevAggs, prevWritten, prevAt = row.events, row.aggs, wr, now
	}
	_ = prevAggs
	lr := <-loadDone
	if lr.err != nil {
		return nil, fmt.Errorf("writers: %w", lr.err)
	}
	out.rows = rows
	out.written = written.Load()
	if lsn, err := se.walLSN(ctx); err == nil {
		out.walBytes = lsn - lsn0
	}
	if cpu1, ok := clusterCPU(dataDir); ok && cpuOK {
		out.cpu, out.cpuKnown = cpu1-cpu0, true
	}
	if pgss {
		out.stmts = se.statementGroups(ctx, s.schema)
	}
	// Let the relay publish what is left, then check nothing was lost. A
	// relay that fell behind is reported (how long it took, or how much was
	// left after two minutes), not treated as an error: the table is the
	// point of the run.
	drainStart := time.Now()
	for {
		if out.left, err = se.unpublished(ctx, s.schema); err != nil {
			return out, err
		}
		if out.left == 0 || time.Since(drainStart) > 2*time.Minute {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return out, err
		}
	}
	out.drained = time.Since(drainStart)
	relayStopped = true
	err = stopRelay()
	for _, l := range relayLog.take() {
		se.logf("soak: relay: %s", l)
	}
	if err != nil {
		return out, fmt.Errorf("relay: %w", err)
	}
	if pub := r.Stats().Published; out.left == 0 && pub < written.Load() {
		return out, fmt.Errorf("relay published %d events, writers committed %d", pub, written.Load())
	}
	se.logf("soak: offered %d events in %s (%.0f/s), committed %d, relay published %d; %d left unpublished %s after the load ended",
		lr.sent, lr.elapsed.Round(time.Millisecond), float64(lr.sent)/lr.elapsed.Seconds(), written.Load(), r.Stats().Published,
		out.left, out.drained.Round(time.Millisecond))

	// The table again, in one piece, for BENCHMARKS.md.
	manual := "no manual VACUUM"
	if sz.vacuumEvery > 0 {
		manual = "VACUUM (ANALYZE) every " + sz.vacuumEvery.String()
	}
	layout := "plain table, clean-up by DELETE"
	if kind == soakPartitioned {
		layout = fmt.Sprintf("partitioned by %s, clean-up by partition drop (%d dropped)", sz.partitionInterval, out.dropped)
	}
	fmt.Fprintf(se.logw, "\nsoak %s, autovacuum %s: %s; %d events/s offered for %s, replay horizon (clean-up) %s, %s, %s; server: %s; outbox_events: %s\n\n%s\n%s\n",
		kind, av, layout, sz.rate, sz.duration, sz.retention, manual, out.relayVac, out.server, reloptions, soakHeader, soakDivider())
	for _, row := range rows {
		fmt.Fprintln(se.logw, row)
	}
	fmt.Fprintln(se.logw)
	return out, nil
}

// walLSN is the server's current WAL position, in bytes.
func (e *env) walLSN(ctx context.Context) (int64, error) {
	var n int64
	err := e.admin.QueryRow(ctx, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").Scan(&n)
	return n, err
}

// partitionNames lists the partitions of schema's outbox_events (none for a
// plain table).
func (e *env) partitionNames(ctx context.Context, schema string) ([]string, error) {
	rows, err := e.admin.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, schema+".outbox_events")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// clusterCPU is the CPU time the private cluster's processes used so far:
// the postmaster's own and its reaped children's (cutime, cstime), and its
// live children's. false without a private cluster (dataDir "") or /proc.
func clusterCPU(dataDir string) (time.Duration, bool) {
	if dataDir == "" {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	pm := strings.SplitN(string(b), "\n", 2)[0]
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	const hz = 100 // USER_HZ, 100 on every Linux the bench runs on
	var ticks int64
	for _, d := range ents {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(st), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(st[i+1:])) // f[0] is field 3, the state
		if len(f) < 15 {
			continue
		}
		n := func(k int) int64 { v, _ := strconv.ParseInt(f[k-3], 10, 64); return v }
		switch {
		case d.Name() == pm:
			ticks += n(14) + n(15) + n(16) + n(17)
		case f[1] == pm:
			ticks += n(14) + n(15)
		}
	}
	return time.Duration(ticks) * time.Second / hz, true
}

// stmtGroup is what pg_stat_statements says of one group of statements.
type stmtGroup struct {
	calls    int64
	execMs   float64
	walBytes int64
	// planMs is the statements' planning time (pg_stat_statements.track_planning:
	// the sizing group's cluster only; 0 elsewhere).
	planMs float64
}

// The statement groups of the sizing figures, in the order printed.
var stmtGroupNames = []string{"write", "claim", "mark", "clean-up", "vacuum", "begin/commit", "other"}

// stmtGroupOf names the group of a statement by its text: the writer's
// enqueue (its INSERT and counter update, one function), the relay's
// claim, its mark, the clean-up (the DELETE through cleanup_events, or the
// partition upkeep's DDL and checks), a VACUUM, BEGIN and COMMIT (the
// writers' COMMIT waits for the WAL flush: synchronous_commit is on for
// them), and everything else (the relay's probes and locks, the bench's
// own counting). The bench's statements run on the admin pool and fall in
// "other".
func stmtGroupOf(q string) string {
	q = strings.ToLower(q)
	t := strings.TrimSpace(q)
	switch {
	case strings.HasPrefix(t, "vacuum"):
		return "vacuum"
	case t == "begin", t == "commit", t == "rollback", strings.HasPrefix(t, "begin "):
		return "begin/commit"
	case strings.Contains(q, "cleanup_events("), strings.Contains(q, "create table"), strings.Contains(q, "attach partition"),
		strings.Contains(q, "detach partition"), strings.Contains(q, "drop table"), strings.Contains(q, "num_nonnulls(quarantined_at)"),
		strings.Contains(q, "lock table"):
		return "clean-up"
	case strings.Contains(q, ".enqueue("), strings.Contains(q, ".enqueue_many("),
		strings.Contains(q, "insert into") && strings.Contains(q, "outbox_events"):
		return "write"
	case strings.Contains(q, "set published_at = now()"):
		return "mark"
	case strings.Contains(q, "set claimed_by = $"):
		return "claim"
	}
	return "other"
}

// resetStatements empties pg_stat_statements: false when the server has
// none.
func (e *env) resetStatements(ctx context.Context) bool {
	_, err := e.admin.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err == nil
}

// statementGroups sums pg_stat_statements by group, for the statements of
// the database (the private cluster's holds the soak alone).
func (e *env) statementGroups(ctx context.Context, schema string) map[string]stmtGroup {
	rows, err := e.admin.Query(ctx, `SELECT query, calls, total_exec_time, wal_bytes::bigint, total_plan_time FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		e.logf("soak: pg_stat_statements: %v", err)
		return nil
	}
	defer rows.Close()
	g := map[string]stmtGroup{}
	var others []string
	defer func() {
		slices.SortFunc(others, func(a, b string) int {
			x, _ := strconv.ParseFloat(strings.Fields(a)[0], 64)
			y, _ := strconv.ParseFloat(strings.Fields(b)[0], 64)
			return int(y - x)
		})
		for _, o := range others[:min(3, len(others))] {
			e.logf("soak: statements in other: %s", o)
		}
	}()
	for rows.Next() {
		var q string
		var calls, wal int64
		var exec, plan float64
		if err := rows.Scan(&q, &calls, &exec, &wal, &plan); err != nil {
			e.logf("soak: pg_stat_statements: %v", err)
			return nil
		}
		name := stmtGroupOf(q)
		if name == "other" && exec > 0 {
			others = append(others, fmt.Sprintf("%.0f ms, %d calls: %.120s", exec, calls, strings.Join(strings.Fields(q), " ")))
		}
		s := g[name]
		s.calls += calls
		s.execMs += exec
		s.planMs += plan
		s.walBytes += wal
		g[name] = s
	}
	return g
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

// soakWindows are the summary's means over the first window of the load,
// the second (minutes 5-10 of 30, after the table reached the horizon)
// and the last.
type soakWindows struct {
	pubFirst, pubLast       float64 // published/s
	sizeMid, sizeLast       float64 // outbox_events MB, table and indexes
	claimMid, claimLast     float64 // the intervals' claim p99, mean
	claimMax                float64 // the highest interval's claim p99
	midRows, lastRows, rows int
}

func windowsOf(rows []soakRow, sz soakSizes) soakWindows {
	w := sz.windowOf()
	end := time.Duration(0)
	if len(rows) > 0 {
		end = rows[len(rows)-1].end
	}
	var ws soakWindows
	var pubF, secF, pubL, secL float64
	for _, r := range rows {
		at := r.end.Round(time.Second)
		switch {
		case at <= w:
			pubF += r.published * r.secs
			secF += r.secs
		}
		if at > w && at <= 2*w {
			ws.sizeMid += r.eventsMB
			ws.claimMid += r.claimP99
			ws.midRows++
		}
		if at > end.Round(time.Second)-w {
			pubL += r.published * r.secs
			secL += r.secs
			ws.sizeLast += r.eventsMB
			ws.claimLast += r.claimP99
			ws.lastRows++
		}
		ws.claimMax = max(ws.claimMax, r.claimP99)
	}
	ws.rows = len(rows)
	if secF > 0 {
		ws.pubFirst = pubF / secF
	}
	if secL > 0 {
		ws.pubLast = pubL / secL
	}
	if ws.midRows > 0 {
		ws.sizeMid /= float64(ws.midRows)
		ws.claimMid /= float64(ws.midRows)
	}
	if ws.lastRows > 0 {
		ws.sizeLast /= float64(ws.lastRows)
		ws.claimLast /= float64(ws.lastRows)
	}
	return ws
}

func (o *soakOutcome) name() string { return o.kind + "/autovacuum-" + o.autovacuum }

// perEvent divides by the events written during the load.
func (o *soakOutcome) perEvent(v float64) float64 {
	if o.written == 0 {
		return 0
	}
	return v / float64(o.written)
}

// soakResults summarises one combination: the windows compared and the
// figures per event.
func soakResults(o *soakOutcome, sz soakSizes) []Result {
	if len(o.rows) == 0 {
		return nil
	}
	p := "soak/" + o.name() + "/"
	ws := windowsOf(o.rows, sz)
	w := sz.windowOf()
	first, last := o.rows[0], o.rows[len(o.rows)-1]
	row := func(name string, r soakRow) Result {
		return Result{Scenario: p + name, EventsPerSec: f(r.published), P50: f(r.p50), P99: f(r.p99), Max: f(r.max),
			Value: f(r.eventsMB), Unit: "MB", Seconds: r.end.Seconds(),
			Note: fmt.Sprintf("written %.0f/s, outbox_events live %d dead %d, %d autovacuums, claim %.2f ms (p99 %.2f)",
				r.written, r.events.live, r.events.dead, r.events.autovacuums, r.claimMs, r.claimP99)}
	}
	ratio := func(name string, v float64, of, target string, met bool) Result {
		return Result{Scenario: p + name, Ratio: f(v), RatioOf: of, Target: target, Met: b(met)}
	}
	pub := ws.pubLast / ws.pubFirst
	size := ws.sizeLast / ws.sizeMid
	claim := ws.claimLast / ws.claimMid
	vacuums := last.events.vacuums + last.events.autovacuums
	vacTarget := ""
	var vacMet *bool
	if o.kind == soakPartitioned {
		vacTarget, vacMet = "0", b(vacuums == 0)
	}
	rs := []Result{
		row("first-interval", first),
		row("last-interval", last),
		ratio("published-last-vs-first", pub, fmt.Sprintf("the first %s", w), ">= 0.95", pub >= 0.95),
		ratio("size-last-vs-second-window", size, fmt.Sprintf("%s to %s", w, 2*w), "<= 1.10", size <= 1.10),
		ratio("claim-p99-last-vs-second-window", claim, fmt.Sprintf("%s to %s", w, 2*w), "<= 1.5", claim <= 1.5),
		{Scenario: p + "vacuums-of-outbox-events", Value: f(float64(vacuums)), Unit: "vacuums", Target: vacTarget, Met: vacMet,
			Note: fmt.Sprintf("manual %d, autovacuum %d, summed over partitions (dropped ones included); %s", last.events.vacuums, last.events.autovacuums, o.relayVac)},
		{Scenario: p + "dead-tuples-last", Value: f(float64(last.events.dead)), Unit: "rows",
			Note: fmt.Sprintf("%d events/s for %s, clean-up keeps %s; %s", sz.rate, sz.duration, sz.retention, o.server)},
		{Scenario: p + "wal-bytes-per-event", Value: f(o.perEvent(float64(o.walBytes))), Unit: "B",
			Note: fmt.Sprintf("pg_current_wal_lsn over the load, %d events written (the cluster's WAL)", o.written)},
		{Scenario: p + "index-bytes-per-event", Value: f(float64(last.events.indexBytes) / float64(max(last.events.live, 1))), Unit: "B",
			Note: fmt.Sprintf("indexes %.1f MB over %d live rows at the end", last.indexMB, last.events.live)},
		{Scenario: p + "drain-after-load", Seconds: o.drained.Seconds(),
			Value: f(float64(o.left)), Unit: "left", Target: "0 left", Met: b(o.left == 0),
			Note: "time for the relay to publish what was pending when the writers stopped, and what was still pending after two minutes"},
	}
	if o.cpuKnown {
		rs = append(rs, Result{Scenario: p + "pg-cpu-per-event", Value: f(o.perEvent(float64(o.cpu.Microseconds()))), Unit: "µs",
			Note: "every process of the private cluster (backends, autovacuum, WAL writer, checkpointer) over the load"})
	}
	for _, g := range stmtGroupNames {
		if s, ok := o.stmts[g]; ok {
			rs = append(rs, Result{Scenario: p + "statements/" + g, Value: f(o.perEvent(s.execMs * 1000)), Unit: "µs/event",
				Note: fmt.Sprintf("pg_stat_statements: %d calls, %.0f ms, WAL %.0f B/event", s.calls, s.execMs, o.perEvent(float64(s.walBytes)))})
		}
	}
	return rs
}

// soakWALRatios compares, on each server, the partitioned outbox's WAL per
// event with the DELETE path's (the target: at most 0.8).
func soakWALRatios(outs []*soakOutcome) []Result {
	var rs []Result
	for _, p := range outs {
		if p.kind != soakPartitioned {
			continue
		}
		for _, d := range outs {
			if d.kind != soakDelete || d.autovacuum != p.autovacuum || d.walBytes == 0 || d.written == 0 {
				continue
			}
			v := p.perEvent(float64(p.walBytes)) / d.perEvent(float64(d.walBytes))
			rs = append(rs, Result{Scenario: "soak/" + p.name() + "/wal-per-event-vs-delete", Ratio: f(v),
				RatioOf: "soak/" + d.name() + "/wal-bytes-per-event", Target: "<= 0.8", Met: b(v <= 0.8)})
		}
	}
	return rs
}

// soakSummary is the combinations side by side, one column each.
func soakSummary(outs []*soakOutcome, sz soakSizes) string {
	w := sz.windowOf()
	var bld strings.Builder
	fmt.Fprintf(&bld, "soak summary: %d events/s offered for %s, replay horizon %s, partitions of %s, windows of %s (size and claim: %s-%s against the last %s; published/s: the first %s against the last)\n\n",
		sz.rate, sz.duration, sz.retention, sz.partitionInterval, w, w, 2*w, w, w)
	bld.WriteString("| |")
	for _, o := range outs {
		bld.WriteString(" " + o.kind + ", autovacuum " + o.autovacuum + " |")
	}
	bld.WriteString("\n|---|" + strings.Repeat("---|", len(outs)) + "\n")
	line := func(name string, cell func(o *soakOutcome, ws soakWindows, last soakRow) string) {
		bld.WriteString("| " + name + " |")
		for _, o := range outs {
			if len(o.rows) == 0 {
				bld.WriteString(" - |")
				continue
			}
			bld.WriteString(" " + cell(o, windowsOf(o.rows, sz), o.rows[len(o.rows)-1]) + " |")
		}
		bld.WriteString("\n")
	}
	perEv := func(o *soakOutcome, v float64) string { return fmt.Sprintf("%.0f", o.perEvent(v)) }
	line("relay VACUUM", func(o *soakOutcome, _ soakWindows, _ soakRow) string { return o.relayVac })
	line(fmt.Sprintf("size MB %s-%s (table+indexes)", w, 2*w), func(_ *soakOutcome, ws soakWindows, _ soakRow) string { return fmt.Sprintf("%.1f", ws.sizeMid) })
	line("size MB last "+w.String(), func(_ *soakOutcome, ws soakWindows, _ soakRow) string { return fmt.Sprintf("%.1f", ws.sizeLast) })
	line("size last ÷ second window (≤ 1.10)", func(_ *soakOutcome, ws soakWindows, _ soakRow) string {
		return fmt.Sprintf("%.2f", ws.sizeLast/ws.sizeMid)
	})
	line("published/s first "+w.String(), func(_ *soakOutcome, ws soakWindows, _ soakRow) string { return fmt.Sprintf("%.0f", ws.pubFirst) })
	line("published/s last "+w.String(), func(_ *soakOutcome, ws soakWindows, _ soakRow) string { return fmt.Sprintf("%.0f", ws.pubLast) })
	line("published/s last ÷ first (≥ 0.95)", func(_ *soakOutcome, ws soakWindows, _ soakRow) string {
		return fmt.Sprintf("%.2f", ws.pubLast/ws.pubFirst)
	})
	line("claim p99 ms, second window / last / highest interval", func(_ *soakOutcome, ws soakWindows, _ soakRow) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f", ws.claimMid, ws.claimLast, ws.claimMax)
	})
	line("claim p99 per interval", func(o *soakOutcome, _ soakWindows, _ soakRow) string {
		var ps []string
		for _, r := range o.rows {
			ps = append(ps, fmt.Sprintf("%.1f", r.claimP99))
		}
		return strings.Join(ps, " ")
	})
	line("WAL bytes per event", func(o *soakOutcome, _ soakWindows, _ soakRow) string { return perEv(o, float64(o.walBytes)) })
	line("WAL per event ÷ DELETE path's (≤ 0.8)", func(o *soakOutcome, _ soakWindows, _ soakRow) string {
		for _, d := range outs {
			if d.kind == soakDelete && d.autovacuum == o.autovacuum && d.walBytes > 0 && o.kind == soakPartitioned {
				return fmt.Sprintf("%.2f", o.perEvent(float64(o.walBytes))/d.perEvent(float64(d.walBytes)))
			}
		}
		return "-"
	})
	line("VACUUMs of outbox_events (manual + auto)", func(_ *soakOutcome, _ soakWindows, l soakRow) string {
		return fmt.Sprintf("%d + %d", l.events.vacuums, l.events.autovacuums)
	})
	line("dead rows at the end", func(_ *soakOutcome, _ soakWindows, l soakRow) string { return fmt.Sprint(l.events.dead) })
	line("partitions at the end (dropped)", func(o *soakOutcome, _ soakWindows, l soakRow) string {
		return fmt.Sprintf("%d (%d)", l.events.parts, o.dropped)
	})
	line("outbox_aggregates MB at the end (dead rows, vacuums)", func(_ *soakOutcome, _ soakWindows, l soakRow) string {
		return fmt.Sprintf("%.1f (%d, %d)", float64(l.aggs.bytes)/(1<<20), l.aggs.dead, l.aggs.vacuums+l.aggs.autovacuums)
	})
	line("table bytes per live event", func(_ *soakOutcome, _ soakWindows, l soakRow) string {
		return fmt.Sprintf("%.0f", float64(l.events.bytes-l.events.indexBytes)/float64(max(l.events.live, 1)))
	})
	line("index bytes per live event", func(_ *soakOutcome, _ soakWindows, l soakRow) string {
		return fmt.Sprintf("%.0f", float64(l.events.indexBytes)/float64(max(l.events.live, 1)))
	})
	line("PostgreSQL CPU µs per event (all processes)", func(o *soakOutcome, _ soakWindows, _ soakRow) string {
		if !o.cpuKnown {
			return "-"
		}
		return perEv(o, float64(o.cpu.Microseconds()))
	})
	for _, g := range stmtGroupNames {
		line("statements "+g+": exec µs / WAL B per event", func(o *soakOutcome, _ soakWindows, _ soakRow) string {
			s, ok := o.stmts[g]
			if !ok {
				return "-"
			}
			return fmt.Sprintf("%.1f / %.0f", o.perEvent(s.execMs*1000), o.perEvent(float64(s.walBytes)))
		})
	}
	line("events written in the load", func(o *soakOutcome, _ soakWindows, _ soakRow) string { return fmt.Sprint(o.written) })
	line("left unpublished after the load (drain)", func(o *soakOutcome, _ soakWindows, _ soakRow) string {
		return fmt.Sprintf("%d (%s)", o.left, o.drained.Round(time.Millisecond))
	})
	return bld.String()
}
