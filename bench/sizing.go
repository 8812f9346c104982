package main

// The "sizing" group (only when named): what one event costs PostgreSQL
// on the whole path, stage by stage, for the plain outbox (clean-up by
// DELETE, then VACUUM) and the partitioned one (clean-up by partition
// drop), the figures docs/operations.md "Sizing" projects from (issue 21).
//
// It runs on a private cluster (autovacuum off, pg_stat_statements), so
// that every counter is the run's alone, and one stage at a time, so that
// what a stage costs is not mixed with another's:
//
//  1. steady: writers commit one event per transaction at a fixed rate
//     (the Notifier waking the relay) while a relay publishes to a
//     JetStream stream of the run's own;
//  2. backlog: writers commit as fast as 16 connections go, no relay;
//  3. drain: a relay publishes that backlog (full batches);
//  4. clean-up: Admin.Cleanup of every settled event (a DELETE on the
//     plain table, a partition detach and drop on the partitioned one);
//  5. VACUUM of outbox_events (the plain table's clean-up leaves its dead
//     rows to it; the partitioned one needs none) and of
//     outbox_aggregates (the writers' counter updates, on both).
//
// CPU is the server's, read from /proc/<pid>/stat (utime+stime) of each
// backend, grouped by application_name (each stage's connections carry
// its own), and of the whole cluster (every process, background workers
// and exited children included). The claim and the mark share the relay's
// backends; they are split by their shares of pg_stat_statements'
// execution time. WAL is pg_current_wal_lsn's advance over the stage;
// table and index bytes are outbox_events' growth (or shrink) over it.
// CPU time and bytes do not count how long a stage waited for a loaded
// machine, so the figures can be taken beside other work; a load does
// inflate CPU per event somewhat (lock spinning, cache misses), so such
// figures are upper bounds.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// sizingSizes shape the sizing group.
type sizingSizes struct {
	rate       int           // steady: events/s offered, one per transaction
	duration   time.Duration // steady: how long
	backlog    int           // backlog: events written with no relay
	aggregates int
	// partitionInterval is the partitioned outbox's width: the drop's cost
	// per event is its cost per partition over the events a partition
	// holds, so the group reports both.
	partitionInterval time.Duration
	// partitionsAhead are created with the conversion, enough for the
	// writes of the backlog stage, when no relay's upkeep runs.
	partitionsAhead int
	outboxes        []string
	// explain, when not empty, is a file: the private cluster loads
	// auto_explain and logs the plan, with rows and buffers per node, of
	// every statement slower than explainMin (nested ones too); the
	// server's log is saved there at the end (a diagnosis: it slows every
	// statement a little).
	explain    string
	explainMin time.Duration
}

func defaultSizing() sizingSizes {
	return sizingSizes{rate: 1000, duration: 30 * time.Second, backlog: 30_000, aggregates: 10_000,
		partitionInterval: 10 * time.Second, partitionsAhead: 30, outboxes: soakOutboxKinds}
}

func quickSizing() sizingSizes {
	return sizingSizes{rate: 500, duration: 2 * time.Second, backlog: 2_000, aggregates: 500,
		partitionInterval: time.Second, partitionsAhead: 30, outboxes: soakOutboxKinds}
}

// The application_name of each stage's connections.
const (
	sizingWriterApp  = "sizing-writer"
	sizingRelayApp   = "sizing-relay"
	sizingCleanupApp = "sizing-cleanup"
)

// procCPU is a backend's CPU time so far and what it is.
type procCPU struct {
	app   string
	ticks int64 // utime+stime, in USER_HZ
}

// backendCPU reads the CPU time of every process pg_stat_activity lists,
// by pid.
func (e *env) backendCPU(ctx context.Context) (map[int]procCPU, error) {
	rows, err := e.admin.Query(ctx, `SELECT pid, coalesce(nullif(application_name, ''), backend_type) FROM pg_stat_activity`)
	if err != nil {
		return nil, err
	}
	type pa struct {
		pid int
		app string
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pa, error) {
		var p pa
		err := r.Scan(&p.pid, &p.app)
		return p, err
	})
	if err != nil {
		return nil, err
	}
	out := map[int]procCPU{}
	for _, p := range list {
		if t, ok := procTicks(p.pid); ok {
			out[p.pid] = procCPU{app: p.app, ticks: t}
		}
	}
	return out, nil
}

// procTicks is utime+stime of process pid (fields 14 and 15 of
// /proc/<pid>/stat).
func procTicks(pid int) (int64, bool) {
	st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	i := strings.LastIndexByte(string(st), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(st[i+1:])) // f[0] is field 3
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s, true
}

// appCPU is the CPU the backends of app used between two readings; a
// backend that started in between counts from zero.
func appCPU(before, after map[int]procCPU, app string) time.Duration {
	const hz = 100 // USER_HZ
	var ticks int64
	for pid, a := range after {
		if a.app != app {
			continue
		}
		ticks += a.ticks - before[pid].ticks
	}
	return time.Duration(ticks) * time.Second / hz
}

// sizingStage is one stage's measurement.
type sizingStage struct {
	kind, stage string
	events      int64
	seconds     float64
	backend     time.Duration // the stage's backends
	cluster     time.Duration // every process of the cluster
	wal         int64
	table, idx  int64 // outbox_events' growth over the stage (negative: it shrank)
	stmts       map[string]stmtGroup
	// self is the bench process's own CPU over the stage: in the drain,
	// the relay's (Go, pgx, the NATS client) with the bench's polling.
	self time.Duration
	note string
}

func (s sizingStage) per(v float64) float64 {
	if s.events == 0 {
		return 0
	}
	return v / float64(s.events)
}

// sizingMeter takes the readings at a stage's start and end.
type sizingMeter struct {
	e       *env
	dataDir string
	schema  string
	cpu     map[int]procCPU
	cluster time.Duration
	lsn     int64
	size    tableStats
	start   time.Time
	self    time.Duration
}

// selfCPU is the CPU time this process used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (e *env) startMeter(ctx context.Context, dataDir, schema string) (*sizingMeter, error) {
	m := &sizingMeter{e: e, dataDir: dataDir, schema: schema}
	var err error
	if m.size, err = e.treeStats(ctx, schema, "outbox_events", nil); err != nil {
		return nil, err
	}
	e.resetStatements(ctx)
	if m.lsn, err = e.walLSN(ctx); err != nil {
		return nil, err
	}
	m.cluster, _ = clusterCPU(dataDir)
	if m.cpu, err = e.backendCPU(ctx); err != nil {
		return nil, err
	}
	m.start, m.self = time.Now(), selfCPU()
	return m, nil
}

// stop ends the stage: the backends of app, before their connections
// close.
func (m *sizingMeter) stop(ctx context.Context, kind, stage, app string, events int64) (sizingStage, error) {
	s := sizingStage{kind: kind, stage: stage, events: events, seconds: time.Since(m.start).Seconds(), self: selfCPU() - m.self}
	cpu, err := m.e.backendCPU(ctx)
	if err != nil {
		return s, err
	}
	s.backend = appCPU(m.cpu, cpu, app)
	if c, ok := clusterCPU(m.dataDir); ok {
		s.cluster = c - m.cluster
	}
	lsn, err := m.e.walLSN(ctx)
	if err != nil {
		return s, err
	}
	s.wal = lsn - m.lsn
	s.stmts = m.e.statementGroups(ctx, m.schema)
	m.e.logTopStatements(ctx, kind+" "+stage, 4)
	size, err := m.e.treeStats(ctx, m.schema, "outbox_events", nil)
	if err != nil {
		return s, err
	}
	s.table = (size.bytes - size.indexBytes) - (m.size.bytes - m.size.indexBytes)
	s.idx = size.indexBytes - m.size.indexBytes
	return s, nil
}

// appPool opens a pool of n connections named app, with params.
func (e *env) appPool(ctx context.Context, n int32, app string, params map[string]string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.o.databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = n
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// sizingRelay starts an in-process relay (the library's defaults; no
// clean-up, no VACUUM: they are stages of their own) on connections named
// sizingRelayApp with the session settings of `outbox relay`.
func sizingRelay(ctx context.Context, e *env, s space) (*outbox.Relay, func() error, error) {
	pub, nc, err := e.publisher(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	pool, err := e.appPool(ctx, 4, sizingRelayApp, outbox.RelaySessionParams(e.o.syncCommit))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: s.schema, Publisher: pub, Logger: quietLogger(), VacuumInterval: -1})
	if err != nil {
		nc.Close()
		pool.Close()
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	return r, func() error {
		cancel()
		err := <-done
		nc.Close()
		pool.Close()
		return err
	}, nil
}

// sizingCluster starts the group's private cluster: PostgreSQL's defaults
// as soakCluster sets them, autovacuum off (a VACUUM is a stage of its
// own, not something that happens to fall into another one), planning
// counted by pg_stat_statements (a statement planned again at every call
// costs its planning each time, which total_exec_time does not show), and
// auto_explain with --sizing-explain.
func sizingCluster(ctx context.Context, e *env, sz sizingSizes) (*env, *pgcluster.Cluster, func(), error) {
	settings := soakSettings(soakAVOff)
	settings["pg_stat_statements.track_planning"] = "on"
	if sz.explain != "" {
		autoExplain(settings, sz.explainMin)
	}
	ce, cluster, closeCluster, err := soakClusterWith(ctx, e, settings)
	if err != nil || sz.explain == "" {
		return ce, cluster, closeCluster, err
	}
	return ce, cluster, func() {
		if err := os.WriteFile(sz.explain, []byte(cluster.Log()), 0o644); err != nil {
			e.logf("sizing: --sizing-explain: %v", err)
		} else {
			e.logf("sizing: the server's log, with the plans of statements over %s, is in %s", sz.explainMin, sz.explain)
		}
		closeCluster()
	}, nil
}

// benchSizing is the "sizing" group.
func benchSizing(ctx context.Context, e *env) ([]Result, error) {
	sz := e.sz.sizing
	ce, cluster, closeCluster, err := sizingCluster(ctx, e, sz)
	if err != nil {
		return nil, fmt.Errorf("private cluster: %w", err)
	}
	defer closeCluster()
	e.logf("sizing: private cluster on port %d: %s; load %s", cluster.Port(), ce.serverVacuumSettings(ctx), loadAvg())
	var stages []sizingStage
	var runErr error
	for _, kind := range sz.outboxes {
		if _, err := ce.admin.Exec(ctx, "CHECKPOINT"); err != nil {
			e.logf("checkpoint: %v", err)
		}
		st, err := sizingOne(ctx, ce, cluster.DataDir(), kind, sz)
		stages = append(stages, st...)
		if err != nil {
			runErr = fmt.Errorf("%s: %w", kind, err)
			break
		}
	}
	stages = append(stages, sizingTotals(stages)...)
	fmt.Fprintf(e.logw, "\n%s\n", sizingTable(stages, sz))
	return sizingResults(stages), runErr
}

// sizingOne runs every stage on one outbox kind, on a schema of its own.
func sizingOne(ctx context.Context, e *env, dataDir, kind string, sz sizingSizes) ([]sizingStage, error) {
	s, cleanup, err := e.newSpace(ctx, "sizing_"+kind)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if kind == soakPartitioned {
		if _, err := outboxmigrate.Partition(ctx, e.admin, s.schema, outboxmigrate.PartitionConfig{Interval: sz.partitionInterval,
			Ahead: sz.partitionsAhead}); err != nil {
			return nil, fmt.Errorf("partition: %w", err)
		}
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	if err != nil {
		return nil, err
	}
	wpool, err := e.appPool(ctx, 16, sizingWriterApp, nil)
	if err != nil {
		return nil, err
	}
	defer wpool.Close()
	notifier, err := outbox.NewNotifier(wpool, outbox.NotifierConfig{Schema: s.schema, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	defer notifier.Close()
	var notify atomic.Bool
	write := func() error {
		agg := fmt.Sprintf("sizing-%d", rand.IntN(sz.aggregates))
		err := pgx.BeginFunc(ctx, wpool, func(tx pgx.Tx) error {
			_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: agg, Type: "OrderUpdated", Payload: []byte(payload)})
			return err
		})
		if err == nil && notify.Load() {
			notifier.Notify()
		}
		return err
	}
	// Warm the pool: 16 backends started before the first reading, so
	// their start-up is no stage's.
	if err := warmPool(ctx, wpool, 16); err != nil {
		return nil, err
	}
	var stages []sizingStage
	total := int64(0)
	drained := func(want int64, limit time.Duration) error {
		return e.waitDrained(ctx, s, int(want), limit)
	}

	// 1. steady: writers and relay together.
	r, stopRelay, err := sizingRelay(ctx, e, s)
	if err != nil {
		return nil, err
	}
	relayStopped := false
	defer func() {
		if !relayStopped {
			_ = stopRelay()
		}
	}()
	notify.Store(true)
	m, err := e.startMeter(ctx, dataDir, s.schema)
	if err != nil {
		return stages, err
	}
	e.logf("sizing %s: steady, %d events/s for %s with the relay", kind, sz.rate, sz.duration)
	var wrote atomic.Int64
	sent, elapsed, err := offerLoad(ctx, sz.rate, sz.duration, 16, func() error {
		if err := write(); err != nil {
			return err
		}
		wrote.Add(1)
		return nil
	})
	if err != nil {
		return stages, fmt.Errorf("writers: %w", err)
	}
	total += wrote.Load()
	if err := drained(total, 2*time.Minute); err != nil {
		return stages, err
	}
	// One reading for both: the writers' backends and the relay's are
	// told apart by their application_name.
	wst, err := m.stop(ctx, kind, "write (steady)", sizingWriterApp, wrote.Load())
	if err != nil {
		return stages, err
	}
	rst := wst
	rst.stage, rst.backend = "claim+mark (steady)", 0
	if after, err := e.backendCPU(ctx); err == nil {
		rst.backend = appCPU(m.cpu, after, sizingRelayApp)
	}
	wst.note = fmt.Sprintf("%d offered in %s, relay running; cluster CPU, WAL and sizes are the stage's, writer and relay together", sent, elapsed.Round(time.Millisecond))
	rst.note = fmt.Sprintf("%d published, claims of the few events each wake-up finds; cluster CPU, WAL and sizes as the row above", r.Stats().Published)
	stages = append(stages, wst, rst)
	stages = append(stages, splitClaimMark(rst)...)
	relayStopped = true
	if err := stopRelay(); err != nil {
		return stages, fmt.Errorf("relay: %w", err)
	}

	// 2. backlog: writers alone, as fast as they go.
	notify.Store(false)
	e.logf("sizing %s: backlog, %d events from 16 connections, no relay", kind, sz.backlog)
	if m, err = e.startMeter(ctx, dataDir, s.schema); err != nil {
		return stages, err
	}
	if err := writeN(ctx, 16, sz.backlog, write); err != nil {
		return stages, fmt.Errorf("writers: %w", err)
	}
	bst, err := m.stop(ctx, kind, "write (backlog)", sizingWriterApp, int64(sz.backlog))
	if err != nil {
		return stages, err
	}
	bst.note = "16 connections, no relay"
	stages = append(stages, bst)
	total += int64(sz.backlog)

	// 3. drain: the relay publishes the backlog.
	e.logf("sizing %s: drain", kind)
	if m, err = e.startMeter(ctx, dataDir, s.schema); err != nil {
		return stages, err
	}
	r, stopRelay, err = sizingRelay(ctx, e, s)
	if err != nil {
		return stages, err
	}
	relayStopped = false
	if err := drained(total, 5*time.Minute); err != nil {
		return stages, err
	}
	dst, err := m.stop(ctx, kind, "claim+mark (drain)", sizingRelayApp, int64(sz.backlog))
	if err != nil {
		return stages, err
	}
	dst.note = fmt.Sprintf("%d published in full batches, in %.1f s; the relay process (Go, in the bench) %.1f µs/event",
		r.Stats().Published, dst.seconds, dst.per(float64(dst.self.Microseconds())))
	stages = append(stages, dst)
	stages = append(stages, splitClaimMark(dst)...)
	relayStopped = true
	if err := stopRelay(); err != nil {
		return stages, fmt.Errorf("relay: %w", err)
	}

	// 4. clean-up of every settled event.
	cpool, err := e.appPool(ctx, 1, sizingCleanupApp, nil)
	if err != nil {
		return stages, err
	}
	defer cpool.Close()
	if err := warmPool(ctx, cpool, 1); err != nil {
		return stages, err
	}
	admin, err := outbox.NewAdmin(cpool, outbox.AdminConfig{Schema: s.schema})
	if err != nil {
		return stages, err
	}
	horizon := time.Millisecond
	if kind == soakPartitioned {
		// The partitions holding the events must have ended: ids newer
		// than a partition's end are in the next one.
		if err := sleepCtx(ctx, sz.partitionInterval+100*time.Millisecond); err != nil {
			return stages, err
		}
	}
	var before int64
	if err := e.admin.QueryRow(ctx, "SELECT count(*) FROM "+s.schema+".outbox_events").Scan(&before); err != nil {
		return stages, err
	}
	e.logf("sizing %s: clean-up of %d events", kind, before)
	if m, err = e.startMeter(ctx, dataDir, s.schema); err != nil {
		return stages, err
	}
	res, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: horizon})
	if err != nil {
		return stages, err
	}
	var after int64
	if err := e.admin.QueryRow(ctx, "SELECT count(*) FROM "+s.schema+".outbox_events").Scan(&after); err != nil {
		return stages, err
	}
	name := "clean-up DELETE"
	if kind == soakPartitioned {
		name = "partition drop"
	}
	cst, err := m.stop(ctx, kind, name, sizingCleanupApp, before-after)
	if err != nil {
		return stages, err
	}
	if kind == soakPartitioned {
		n := len(res.PartitionsDropped)
		cst.note = fmt.Sprintf("%d partitions of %s dropped (%.0f events each; %.1f ms CPU per partition, cluster %.1f ms), %d held",
			n, sz.partitionInterval, float64(cst.events)/float64(max(n, 1)), ms(cst.backend)/float64(max(n, 1)),
			ms(cst.cluster)/float64(max(n, 1)), len(res.PartitionsHeld))
	} else {
		cst.note = fmt.Sprintf("%d events in %d batches of %d", res.Events, res.Batches, outbox.CleanupBatchSizeDefault)
	}
	stages = append(stages, cst)
	deleted := cst.events

	// 5. VACUUM: outbox_events on the plain table (its clean-up's debt),
	// outbox_aggregates on both (the writers' counter updates).
	vacuum := func(table, stage, note string) error {
		m, err := e.startMeter(ctx, dataDir, s.schema)
		if err != nil {
			return err
		}
		if _, err := cpool.Exec(ctx, "VACUUM (PARALLEL 0) "+s.schema+"."+table); err != nil {
			return err
		}
		st, err := m.stop(ctx, kind, stage, sizingCleanupApp, deleted)
		if err != nil {
			return err
		}
		st.note = note
		stages = append(stages, st)
		return nil
	}
	if kind == soakDelete {
		if err := vacuum("outbox_events", "VACUUM outbox_events", "after the DELETE, per event deleted; autovacuum off"); err != nil {
			return stages, err
		}
	}
	if err := vacuum("outbox_aggregates", "VACUUM outbox_aggregates",
		fmt.Sprintf("the counters' dead rows, %d aggregates, per event written", sz.aggregates)); err != nil {
		return stages, err
	}
	return stages, nil
}

// splitClaimMark splits a claim+mark stage into the claim and the mark by
// their shares of pg_stat_statements' execution and planning time (the
// CPU) and their own WAL (pg_stat_statements' wal_bytes).
func splitClaimMark(st sizingStage) []sizingStage {
	c, m := st.stmts["claim"], st.stmts["mark"]
	sum := c.execMs + c.planMs + m.execMs + m.planMs
	if sum <= 0 {
		return nil
	}
	var out []sizingStage
	for _, x := range []struct {
		name string
		g    stmtGroup
	}{{"claim", c}, {"mark", m}} {
		share := (x.g.execMs + x.g.planMs) / sum
		out = append(out, sizingStage{kind: st.kind, stage: "  " + x.name + " " + strings.TrimPrefix(st.stage, "claim+mark "),
			events: st.events, seconds: st.seconds, backend: time.Duration(float64(st.backend) * share), wal: x.g.walBytes,
			table: -1, idx: -1, cluster: -1,
			note: fmt.Sprintf("%.0f%% of the claim's and mark's execution and planning time (planning %.0f ms of %.0f); WAL is the statements' own; %d calls",
				100*share, x.g.planMs, x.g.planMs+x.g.execMs, x.g.calls)})
	}
	return out
}

// sizingTotals adds, per kind, the whole path at the steady rate: the
// write, the claim and mark, the clean-up and the VACUUMs it needs.
func sizingTotals(stages []sizingStage) []sizingStage {
	var out []sizingStage
	for _, kind := range soakOutboxKinds {
		t := sizingStage{kind: kind, stage: "total (steady path)", events: 1}
		var parts []string
		found := false
		for _, s := range stages {
			if s.kind != kind || s.events == 0 {
				continue
			}
			switch s.stage {
			case "write (steady)", "clean-up DELETE", "partition drop", "VACUUM outbox_events", "VACUUM outbox_aggregates":
				t.cluster += time.Duration(s.per(float64(s.cluster)))
			case "claim+mark (steady)":
			default:
				continue
			}
			found = true
			t.backend += time.Duration(s.per(float64(s.backend)))
			if s.stage != "claim+mark (steady)" {
				t.wal += int64(s.per(float64(s.wal)))
			}
			parts = append(parts, strings.TrimSpace(s.stage))
		}
		if !found {
			continue
		}
		t.table, t.idx = -1, -1
		t.note = "per event: " + strings.Join(parts, " + ") + " (the steady stage's cluster CPU and WAL hold both the write and the claim+mark)"
		out = append(out, t)
	}
	return out
}

// sizingTable is the group's table, one row per stage and outbox kind.
func sizingTable(stages []sizingStage, sz sizingSizes) string {
	var bld strings.Builder
	fmt.Fprintf(&bld, "sizing: the cost of an event on a private cluster (autovacuum off), %d events/s steady for %s, a %d-event backlog, partitions of %s; load %s\n\n",
		sz.rate, sz.duration, sz.backlog, sz.partitionInterval, loadAvg())
	bld.WriteString("| outbox | stage | events | backends CPU µs/event | cluster CPU µs/event | WAL B/event | table B/event | index B/event | note |\n")
	bld.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	neg := func(v float64, ok bool) string {
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%.0f", v)
	}
	for _, s := range stages {
		fmt.Fprintf(&bld, "| %s | %s | %d | %.1f | %s | %s | %s | %s | %s |\n", s.kind, s.stage, s.events, s.per(float64(s.backend.Microseconds())),
			neg(s.per(float64(s.cluster.Microseconds())), s.cluster >= 0), neg(s.per(float64(s.wal)), true),
			neg(s.per(float64(s.table)), s.table != -1), neg(s.per(float64(s.idx)), s.idx != -1), s.note)
	}
	return bld.String()
}

// sizingResults are the stages as results: the value is the backends' CPU
// per event, the rest in the note.
func sizingResults(stages []sizingStage) []Result {
	var rs []Result
	for _, s := range stages {
		name := strings.ReplaceAll(strings.TrimSpace(s.stage), " ", "-")
		name = strings.NewReplacer("(", "", ")", "").Replace(name)
		r := Result{Scenario: "sizing/" + s.kind + "/" + name, Value: f(s.per(float64(s.backend.Microseconds()))), Unit: "µs/event",
			Events: s.events, Seconds: s.seconds}
		var n []string
		if s.cluster >= 0 {
			n = append(n, fmt.Sprintf("cluster CPU %.1f µs/event", s.per(float64(s.cluster.Microseconds()))))
		}
		n = append(n, fmt.Sprintf("WAL %.0f B/event", s.per(float64(s.wal))))
		if s.table != -1 {
			n = append(n, fmt.Sprintf("table %.0f B/event, indexes %.0f B/event", s.per(float64(s.table)), s.per(float64(s.idx))))
		}
		if s.note != "" {
			n = append(n, s.note)
		}
		r.Note = strings.Join(n, "; ")
		rs = append(rs, r)
	}
	return rs
}

// logTopStatements logs the n statements of the stage that took the most
// time (planning and execution): calls, plans, times, buffers per call and
// the start of their text, to tell which statement a stage's CPU went to
// and whether it is planned at every call.
func (e *env) logTopStatements(ctx context.Context, stage string, n int) {
	rows, err := e.admin.Query(ctx, `SELECT calls, plans, total_plan_time, total_exec_time, shared_blks_hit + shared_blks_read, rows,
	left(regexp_replace(query, '\s+', ' ', 'g'), 90)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_plan_time + total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		e.logf("sizing: pg_stat_statements: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var calls, plans, blks, nrows int64
		var plan, exec float64
		var q string
		if err := rows.Scan(&calls, &plans, &plan, &exec, &blks, &nrows, &q); err != nil {
			e.logf("sizing: pg_stat_statements: %v", err)
			return
		}
		e.logf("sizing %s: %d calls, %d plans, planning %.0f ms, execution %.0f ms, %d buffers/call, %d rows: %s",
			stage, calls, plans, plan, exec, blks/max(calls, 1), nrows, q)
	}
}

// warmPool opens n connections of pool (and returns them to it).
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// writeN calls do n times from workers goroutines, each call after
// the previous one of its goroutine; the first error stops it.
func writeN(ctx context.Context, workers, n int, do func() error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				if err := do(); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// override returns s with o's non-zero fields (the command line's).
func (s sizingSizes) override(o sizingSizes) sizingSizes {
	if o.rate > 0 {
		s.rate = o.rate
	}
	if o.duration > 0 {
		s.duration = o.duration
	}
	if o.backlog > 0 {
		s.backlog = o.backlog
	}
	if o.partitionInterval > 0 {
		s.partitionInterval = o.partitionInterval
	}
	if len(o.outboxes) > 0 {
		s.outboxes = o.outboxes
	}
	if o.explain != "" {
		s.explain, s.explainMin = o.explain, o.explainMin
	}
	return s
}
