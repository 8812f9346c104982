package main

// The "pressure" group (only when named): the pressure cells of issues 24
// and 27. On a private PostgreSQL cluster with its default settings
// (autovacuum on; wal_level=logical when CDC runs), writers commit one event
// per transaction over a pool of aggregates at a fixed rate with the
// Notifier, two relays publish to a JetStream stream of the run's own, and
// a consumer of that stream records each event's arrival. Then, one cell
// after the other, each followed by a recovery at the same rate: a clean
// phase, a pinned xmin, REPEATABLE READ readers, 1.5x load, busy and idle
// relay connections killed once a second, and a pool of idle connections
// holding the server near max_connections.
//
// The relays are what a user runs: two `outbox relay` processes built from
// cmd/outbox (polling, defaults), two `outbox relay --mode cdc` processes in
// one group, or a naive unordered relay in the bench process. The bench
// only uses what a user sees: the command line, the database, the relays'
// /metrics and /readyz, the stream. So the same bench measures today's
// relay and tomorrow's.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/outbox/internal/pgcluster"
)

// pressureCells in the order they run.
// "takeover" runs for the CDC relays only.
var pressureCells = []string{"clean", "xmin", "readers", "load", "kill-busy", "kill-idle", "pool", "takeover"}

// pressureRelayKinds in the order they run.
var pressureRelayKinds = []string{"polling", "naive", "cdc"}

// cellDescriptions say what each cell does, for the notes and --help.
var cellDescriptions = map[string]string{
	"clean":     "no fault",
	"xmin":      "a session holds BEGIN; SELECT txid_current(); open for the cell (the xmin pinned)",
	"readers":   "REPEATABLE READ readers re-scanning outbox_events (count(*), pending count, newest 100) in a loop",
	"load":      "1.5x the rate",
	"kill-busy": "pg_terminate_backend on the relays' busy backends (state active or idle in transaction) every kill interval",
	"kill-idle": "pg_terminate_backend on the relays' idle backends (as idle_session_timeout or a pooler does) every kill interval",
	"pool":      "idle connections of another role fill the server up to max_connections minus the free slots",
	"takeover": "CDC only: a session holds a transaction that wrote WAL open for the cell (the xmin and the slot's restart_lsn pinned); " +
		"half-way through, the streaming relay is killed (SIGKILL) and started again, to stand by",
}

// pressureSizes shape the pressure group.
type pressureSizes struct {
	rate       int // events/s, one event per transaction
	aggregates int
	writers    int // writer connections
	cellDur    map[string]time.Duration
	recovery   time.Duration // after each cell, at the base rate
	warmup     time.Duration // before the first cell, not reported
	killEvery  time.Duration // kill cells: one pg_terminate_backend round per interval
	poolFree   int           // pool cell: connection slots left free
	readers    int           // readers cell: how many readers
	lease      time.Duration // the relays' lease (their default): the late threshold of the strict check
	drain      time.Duration // after the last phase: how long to wait for the last events
	cells      []string
	relays     []string
	// countPending also counts the pending rows (count(*) ... WHERE
	// published_at IS NULL) once a second from one connection: the
	// monitoring query of issue 24's second figure; itself a load under a
	// pinned xmin.
	countPending bool
	// explain, when not empty, is a file: the private cluster loads
	// auto_explain and logs the plan, with rows and buffers per node, of
	// every statement slower than explainMin; the server's log is saved
	// there when the group ends (a diagnosis: log_analyze costs a little
	// on every statement).
	explain    string
	explainMin time.Duration
}

func defaultPressure() pressureSizes {
	return pressureSizes{rate: 800, aggregates: 2000, writers: 16,
		cellDur: map[string]time.Duration{"clean": 2 * time.Minute, "xmin": 10 * time.Minute, "readers": 10 * time.Minute,
			"load": 2 * time.Minute, "kill-busy": 2 * time.Minute, "kill-idle": 2 * time.Minute, "pool": 2 * time.Minute,
			"takeover": 4 * time.Minute},
		recovery: time.Minute, warmup: 10 * time.Second, killEvery: time.Second, poolFree: 15, readers: 4,
		lease: 30 * time.Second, drain: 2 * time.Minute, cells: pressureCells, relays: pressureRelayKinds}
}

func quickPressure() pressureSizes {
	p := defaultPressure()
	p.cellDur = map[string]time.Duration{}
	for _, c := range pressureCells {
		p.cellDur[c] = 10 * time.Second
	}
	p.cellDur["xmin"] = 20 * time.Second
	p.recovery, p.warmup = 5*time.Second, 3*time.Second
	p.drain = p.lease + 30*time.Second
	return p
}

// pressureFlags are the command line's overrides (zero: keep the size's).
type pressureFlags struct {
	cells, relays, cellDur string
	recovery, killEvery    time.Duration
	rate, aggregates       int
	countPending           bool
	explain                string
	explainMin             time.Duration
}

// apply returns p with the command line's overrides.
func (fl pressureFlags) apply(p pressureSizes) (pressureSizes, error) {
	if fl.cells != "" {
		p.cells = nil
		for _, c := range strings.Split(fl.cells, ",") {
			if !slices.Contains(pressureCells, c) {
				return p, fmt.Errorf("unknown pressure cell %q (cells: %s)", c, strings.Join(pressureCells, ","))
			}
			p.cells = append(p.cells, c)
		}
	}
	if fl.relays != "" {
		p.relays = nil
		for _, r := range strings.Split(fl.relays, ",") {
			if !slices.Contains(pressureRelayKinds, r) {
				return p, fmt.Errorf("unknown pressure relay %q (relays: %s)", r, strings.Join(pressureRelayKinds, ","))
			}
			p.relays = append(p.relays, r)
		}
	}
	if fl.cellDur != "" {
		durs := map[string]time.Duration{}
		for k, v := range p.cellDur {
			durs[k] = v
		}
		for _, part := range strings.Split(fl.cellDur, ",") {
			name, val, named := strings.Cut(part, "=")
			if !named {
				val = name
			}
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 {
				return p, fmt.Errorf("--pressure-cell-duration %q: want a positive duration, or cell=duration,...", part)
			}
			switch {
			case !named:
				for _, c := range pressureCells {
					durs[c] = d
				}
			case slices.Contains(pressureCells, name):
				durs[name] = d
			default:
				return p, fmt.Errorf("--pressure-cell-duration: unknown cell %q", name)
			}
		}
		p.cellDur = durs
	}
	if fl.recovery > 0 {
		p.recovery = fl.recovery
	}
	if fl.killEvery > 0 {
		p.killEvery = fl.killEvery
	}
	if fl.rate > 0 {
		p.rate = fl.rate
	}
	if fl.aggregates > 0 {
		p.aggregates = fl.aggregates
	}
	p.countPending = p.countPending || fl.countPending
	if fl.explain != "" {
		p.explain, p.explainMin = fl.explain, fl.explainMin
	}
	return p, nil
}

// pressureCluster starts the group's private cluster: PostgreSQL's default
// settings (pgcluster's smaller max_connections and shared_buffers are set
// back to PostgreSQL's defaults, 100 and 128MB), wal_level=logical when CDC
// runs, and an env on it.
func pressureCluster(ctx context.Context, e *env, logical bool, sz pressureSizes) (*env, *pgcluster.Cluster, func(), error) {
	// pg_stat_statements: the buffers of the relays' claims, first window
	// against last (claimStatements).
	settings := map[string]string{"max_connections": "100", "shared_buffers": "128MB",
		"shared_preload_libraries": "pg_stat_statements"}
	if logical {
		settings["wal_level"] = "logical"
	}
	if sz.explain != "" {
		autoExplain(settings, sz.explainMin)
	}
	cluster, err := pgcluster.Start(pgcluster.Config{Settings: settings})
	if err != nil {
		return nil, nil, nil, err
	}
	o := e.o
	o.databaseURL = cluster.URL("")
	pe, err := newEnv(ctx, o, e.logw)
	if err != nil {
		_ = cluster.Close()
		return nil, nil, nil, err
	}
	if _, err := pe.admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		pe.close()
		_ = cluster.Close()
		return nil, nil, nil, err
	}
	return pe, cluster, func() {
		pe.close()
		if sz.explain != "" {
			if err := os.WriteFile(sz.explain, []byte(cluster.Log()), 0o644); err != nil {
				e.logf("pressure: --pressure-explain: %v", err)
			} else {
				e.logf("pressure: the server's log, with the plans of statements over %s, is in %s", sz.explainMin, sz.explain)
			}
		}
		_ = cluster.Close()
	}, nil
}

// benchPressure is the "pressure" group: every selected relay kind through
// every selected cell, on one private cluster, one kind after the other.
func benchPressure(ctx context.Context, e *env) ([]Result, error) {
	runs, walLevel, err := pressureRuns(ctx, e)
	if len(runs) > 0 {
		fmt.Fprintf(e.logw, "\n%s\n", pressureTable(runs, e.sz.pressure, walLevel))
	}
	return pressureResults(runs, e.sz.pressure, walLevel), err
}

// pressureRuns runs the group and returns each relay kind's outcome (also
// those that ended before an error) and the cluster's wal_level.
func pressureRuns(ctx context.Context, e *env) ([]*pressureOutcome, string, error) {
	sz := e.sz.pressure
	bin, err := e.outboxBinary()
	if err != nil {
		return nil, "", err
	}
	logical := slices.Contains(sz.relays, "cdc")
	pe, cluster, closeCluster, err := pressureCluster(ctx, e, logical, sz)
	if err != nil {
		return nil, "", err
	}
	defer closeCluster()
	server := pe.serverVacuumSettings(ctx)
	var walLevel string
	_ = pe.admin.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel)
	e.logf("pressure: private cluster on port %d: %s wal_level=%s", cluster.Port(), server, walLevel)
	var cellsLine []string
	for _, c := range sz.cells {
		cellsLine = append(cellsLine, fmt.Sprintf("%s %s", c, sz.cellDur[c]))
	}
	e.logf("pressure: relays %s; cells %s, each followed by a %s recovery; %d events/s over %d aggregates",
		strings.Join(sz.relays, ","), strings.Join(cellsLine, ", "), sz.recovery, sz.rate, sz.aggregates)
	var runs []*pressureOutcome
	for _, kind := range sz.relays {
		if _, err := pe.admin.Exec(ctx, "CHECKPOINT"); err != nil {
			e.logf("checkpoint: %v", err)
		}
		out, err := runPressure(ctx, pe, cluster, bin, kind, sz)
		if out != nil && out.stats != nil {
			runs = append(runs, out)
		}
		if err != nil {
			return runs, walLevel, fmt.Errorf("%s: %w", kind, err)
		}
	}
	return runs, walLevel, nil
}

// autoExplain adds to a private cluster's settings auto_explain's plans,
// with rows and buffers per plan node, of every statement (nested ones too)
// slower than min, without per-node timing (its clock reads cost most of
// log_analyze's overhead).
func autoExplain(settings map[string]string, min time.Duration) {
	settings["shared_preload_libraries"] += ",auto_explain"
	settings["auto_explain.log_min_duration"] = strconv.FormatInt(min.Milliseconds(), 10) + "ms"
	settings["auto_explain.log_analyze"] = "on"
	settings["auto_explain.log_buffers"] = "on"
	settings["auto_explain.log_timing"] = "off"
	settings["auto_explain.log_nested_statements"] = "on"
}
