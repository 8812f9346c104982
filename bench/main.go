// Command bench measures the outbox against the machine's limit and a peer
// (Watermill's SQL forwarder), on the real PostgreSQL and NATS JetStream
// servers, and prints one table (or --json, one object per scenario).
//
// It lives in its own Go module so that the product never depends on the
// peer. Run it from the repository root:
//
//	cd bench && go run .            # the default run (about 10 minutes before the destinations group)
//	cd bench && go run . --quick    # a smoke run, under a minute: every default group but destinations, at sizes too small for figures
//	cd bench && go run . --long     # a 1,000,000-event backlog
//	cd bench && go run . --json     # one JSON object per scenario
//	cd bench && go run . --only soak  # writers and relay together, 10 minutes, DELETE and partitioned outboxes, private clusters with autovacuum off then on
//	cd bench && go run . --only soak --soak-duration 30m --soak-retention 2m --soak-partition-interval 1m --soak-rate N  # issue 21's soak (2 hours)
//	cd bench && go run . --only outage  # a 2 s NATS outage under load; a webhook answering 5% 503 or 500
//	cd bench && go run . --only destinations  # each destination beside a naive publisher
//	cd bench && go run . --only destinations --destinations kafka
//	cd bench && go run . --only sizing  # what an event costs PostgreSQL, stage by stage (CPU, WAL, bytes), DELETE and partitioned outboxes, on a private cluster (about 10 minutes)
//	cd bench && go run . --only pressure  # the pressure cells of issues 24 and 27 (over an hour; see --pressure-*)
//
// Every scenario uses its own PostgreSQL schema (or database) and its own
// JetStream stream (in the destinations group, its own Kafka cluster and
// topic, RabbitMQ exchange and queue, or webhook receiver), and removes them
// when it ends. Progress goes to stderr;
// the table (or JSON) to stdout. See BENCHMARKS.md for what each figure means
// and what limits it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// Result is one scenario's outcome. EventsPerSec, P50, P99 and Ratio are
// always present in the JSON (null when they do not apply).
type Result struct {
	Scenario     string   `json:"scenario"`
	EventsPerSec *float64 `json:"events_per_sec"`
	P50          *float64 `json:"p50_ms"`
	P99          *float64 `json:"p99_ms"`
	Ratio        *float64 `json:"ratio"`
	// RatioOf names the scenario Ratio divides by (same run).
	RatioOf string   `json:"ratio_of,omitempty"`
	Max     *float64 `json:"max_ms,omitempty"`
	// Value and Unit carry figures that are not rates (queries/s, MB).
	Value   *float64 `json:"value,omitempty"`
	Unit    string   `json:"unit,omitempty"`
	Events  int64    `json:"events,omitempty"`
	Seconds float64  `json:"seconds,omitempty"`
	Target  string   `json:"target,omitempty"`
	Met     *bool    `json:"met,omitempty"`
	Note    string   `json:"note,omitempty"`
	// Series is a figure at every second (the pressure group: the backlog).
	Series []int64 `json:"backlog_per_sec,omitempty"`
	// Smoke marks a result of a --quick run: it shows that the scenario
	// runs, not a figure (no target is checked).
	Smoke bool `json:"smoke,omitempty"`
}

// A ratio of two measurements is a figure only when each was taken over at
// least minFigureEvents events (ten batches of 1,000) and minFigureSeconds:
// below that, the start (connections, the stream's creation, the first
// claim) and the last partial batch weigh more than the few percent a
// comparison is about, and a second of load from elsewhere on a shared
// machine moves it. A --quick run's drains (5,000 events, a fraction of a
// second) are below, and a --quick run prints no such ratio whatever its
// drains took (on a slow enough machine they could last 2 s).
const (
	minFigureEvents  = 10_000
	minFigureSeconds = 2.0
)

// sample is what a rate was measured over.
type sample struct {
	events  int64
	seconds float64
}

func (s sample) String() string { return fmt.Sprintf("%d events in %.2f s", s.events, s.seconds) }

func (s sample) enough() bool { return s.events >= minFigureEvents && s.seconds >= minFigureSeconds }

// compare sets r's ratio to ratio, of the scenario named of, when both
// samples support a figure and the run is no smoke run; otherwise it leaves
// the ratio out (null in the JSON, "-" in the table) and says why in the
// note.
func (r *Result) compare(smoke bool, ratio float64, of string, mine, theirs sample) {
	r.RatioOf = of
	if !smoke && mine.enough() && theirs.enough() {
		r.Ratio = f(ratio)
		return
	}
	what := "sample"
	if smoke {
		what = "smoke run: sizes"
	}
	why := fmt.Sprintf("%s too small for a comparison with %s (this: %s; that: %s; a figure needs %d events and %.0f s on each side, and no --quick)",
		what, of, mine, theirs, minFigureEvents, minFigureSeconds)
	if r.Note != "" {
		why = r.Note + "; " + why
	}
	r.Note = why
}

func f(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func b(v bool) *bool { return &v }

// sizes scale a run.
type sizes struct {
	writeDur       time.Duration // per (kind, clients) measurement, per round
	writeRounds    int
	clients        []int
	backlog        int
	aggregates     int
	watermillCap   time.Duration
	watermill      []string // the wmVariants to run, by scenario (nil: all)
	latencyDur     time.Duration
	latencyRate    int
	latencyClients int // writer connections of the latency runs
	notifyWriteDur time.Duration
	scaleCounts    []int
	scaleNoAhead   bool // the scale group also runs 1 and 2 relays with --no-claim-ahead
	history        int
	idleDur        time.Duration
	idleSettle     time.Duration // the idle relay's start-up, before counting
	checkpoint     bool          // a CHECKPOINT before each group
	soak           soakSizes
	outage         time.Duration // cdc-outage: how long no relay runs
	pressure       pressureSizes
	sizing         sizingSizes
}

func defaultSizes() sizes {
	return sizes{
		writeDur: time.Second, writeRounds: 6, clients: []int{1, 4, 16},
		backlog: 200_000, aggregates: 10_000, watermillCap: 30 * time.Second,
		latencyDur: 30 * time.Second, latencyRate: 1000, latencyClients: 16, notifyWriteDur: 1500 * time.Millisecond,
		scaleCounts: []int{1, 2, 4}, scaleNoAhead: true, history: 5_000_000, idleDur: 20 * time.Second, idleSettle: 3 * time.Second,
		checkpoint: true, soak: defaultSoak(), outage: 5 * time.Minute, pressure: defaultPressure(),
		sizing: defaultSizing(),
	}
}

// quickSizes are a smoke run's: every scenario of quickGroups runs once, on
// the smallest sizes that still exercise it (a backlog of 5 batches, two
// relay processes, a second of offered load), so that the run takes under a
// minute on two cores; none of its figures is one (see Result.Smoke).
func quickSizes() sizes {
	return sizes{
		writeDur: 250 * time.Millisecond, writeRounds: 1, clients: []int{1, 4, 16},
		backlog: 5_000, aggregates: 500, watermillCap: 4 * time.Second,
		// One Watermill configuration per schema (the other two differ
		// only in their settings' values).
		watermill:  []string{"defaults", "queue-batch1000"},
		latencyDur: 1500 * time.Millisecond, latencyRate: 1000, latencyClients: 16, notifyWriteDur: 300 * time.Millisecond,
		scaleCounts: []int{1, 2}, history: 20_000, idleDur: 2 * time.Second, idleSettle: time.Second,
		soak: quickSoak(), outage: 5 * time.Second, pressure: quickPressure(),
		sizing: quickSizing(),
	}
}

// groups in the order they run by default.
var allGroups = []string{"write", "inbox", "relay", "latency", "destinations", "scale", "history", "blocked", "idle"}

// quickGroups are what --quick runs unless --only names groups: the default
// groups but the destinations group, which is the relay group again for
// each of four brokers (about a minute on its own; CI's TestQuickRun runs
// it, and --quick --only destinations does).
var quickGroups = slices.DeleteFunc(slices.Clone(allGroups), func(g string) bool { return g == "destinations" })

// extraGroups run only when named with --only: they take long.
var extraGroups = []string{"soak", "cdc", "cdc-outage", "outage", "pressure", "sizing"}

type options struct {
	json, quick, long, keep bool
	skipPeer, tuneBatch     bool
	syncCommit              bool
	only                    []string
	dests                   []string // destinations group: which destinations (nil: all)
	databaseURL, natsURL    string
	amqpURL                 string
	explainFile, jsonOut    string
	cpuProfile              string
	sz                      sizes
}

func main() {
	var o options
	var only string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.BoolVar(&o.json, "json", false, "print one JSON object per scenario instead of the table")
	fs.BoolVar(&o.quick, "quick", false, "a smoke run in under a minute: every default group but destinations (--only names others), at sizes too small for figures: no ratio between drains and no target")
	fs.BoolVar(&o.long, "long", false, "a 1,000,000-event backlog for the relay throughput scenarios")
	fs.BoolVar(&o.keep, "keep", false, "keep the schemas and streams (to inspect them)")
	fs.BoolVar(&o.skipPeer, "skip-peer", false, "skip the Watermill scenarios (to iterate on our relay)")
	fs.BoolVar(&o.tuneBatch, "batch-sweep", false, "also drain the relay backlog with batch sizes 250, 500, 1000 and 2000")
	fs.BoolVar(&o.syncCommit, "sync-commit", false, "run every relay with synchronous_commit on (outbox relay --sync-commit)")
	fs.StringVar(&only, "only", "", "comma-separated groups to run: "+strings.Join(allGroups, ",")+
		" (the default), and "+strings.Join(extraGroups, ",")+" (only when named)")
	var dests string
	var backlog int
	fs.IntVar(&backlog, "backlog", 0, "the relay and destinations groups' backlog, in events, over one aggregate per 20 events (default 200000, --quick 5000, --long 1000000)")
	fs.StringVar(&dests, "destinations", "", "destinations group: comma-separated destinations to run (default all: "+destinationNames()+")")
	var soak soakSizes
	var outage time.Duration
	var latencyClients int
	fs.IntVar(&latencyClients, "latency-clients", 0, "writer connections offering the latency runs' load (default 16)")
	fs.DurationVar(&outage, "outage", 0, "cdc-outage: how long no relay runs while writers fill the backlog (default 5m, --quick 5s)")
	fs.DurationVar(&soak.duration, "soak-duration", 0, "soak: how long writers and relay run together (default 10m, --quick 6s)")
	fs.IntVar(&soak.rate, "soak-rate", 0, "soak: events/s offered by the writers, one event per transaction (default 1000)")
	fs.DurationVar(&soak.interval, "soak-interval", 0, "soak: one table row per interval (default 1m, --quick 2s)")
	fs.DurationVar(&soak.retention, "soak-retention", 0, "soak: the relay's clean-up deletes events published longer ago than this (default 1m, --quick 2s)")
	fs.DurationVar(&soak.relayVacuum, "soak-relay-vacuum", 0, "soak: the relay's RelayConfig.VacuumInterval (default the library's on the DELETE path, off on the partitioned one; negative: the relay never vacuums, as in run (a) of BENCHMARKS.md)")
	fs.DurationVar(&soak.vacuumEvery, "soak-vacuum-every", 0, "soak: also run VACUUM (ANALYZE) on the outbox tables this often, as a cron job would where autovacuum is off (default never)")
	fs.IntVar(&soak.aggregates, "soak-aggregates", 0, "soak: events go to this many aggregates, so counter rows are updated (default 10000)")
	var soakOutboxes, soakAV string
	fs.StringVar(&soakOutboxes, "soak-outboxes", "", "soak: comma-separated outbox kinds, one after the other, each on a schema of its own: "+
		"delete (a plain outbox_events, clean-up by DELETE), partitioned (outboxmigrate.Partition, settled partitions dropped past the horizon) (default both)")
	fs.StringVar(&soakAV, "soak-autovacuum", "", "soak: comma-separated servers, one after the other, every outbox kind on each: "+
		"off, on (a private cluster with autovacuum off or on, and pg_stat_statements), server (the --database-url server as it is) (default off,on; --quick off)")
	fs.DurationVar(&soak.partitionInterval, "soak-partition-interval", 0, "soak: the partitioned outbox's partition width (default 1m, --quick 1s)")
	fs.IntVar(&soak.partitionsAhead, "soak-partitions-ahead", 0, "soak: partitions kept ready after the current one, by the conversion and the relay's upkeep (default the library's, 6; --quick 20)")
	fs.DurationVar(&soak.window, "soak-window", 0, "soak: the span the summary compares: the first against the last (published/s), the second against the last (size, claim p99) (default a sixth of --soak-duration)")
	var sizing sizingSizes
	fs.IntVar(&sizing.rate, "sizing-rate", 0, "sizing: events/s offered in the steady stage, one event per transaction, with the relay running (default 1000)")
	fs.DurationVar(&sizing.duration, "sizing-duration", 0, "sizing: the steady stage's duration (default 30s, --quick 2s)")
	fs.IntVar(&sizing.backlog, "sizing-backlog", 0, "sizing: events written with no relay, then drained (default 30000, --quick 2000)")
	fs.DurationVar(&sizing.partitionInterval, "sizing-partition-interval", 0, "sizing: the partitioned outbox's partition width (default 10s, --quick 1s)")
	var sizingOutboxes string
	fs.StringVar(&sizingOutboxes, "sizing-outboxes", "", "sizing: comma-separated outbox kinds, one after the other: delete, partitioned (default both)")
	fs.StringVar(&sizing.explain, "sizing-explain", "", "sizing: load auto_explain in the private cluster and save its log, with the plan (rows and buffers per node) of every statement slower than --sizing-explain-min, to this file (a diagnosis; it slows every statement a little)")
	fs.DurationVar(&sizing.explainMin, "sizing-explain-min", 50*time.Millisecond, "sizing: with --sizing-explain, the shortest statement whose plan is logged")
	var pf pressureFlags
	fs.StringVar(&pf.cells, "pressure-cells", "", "pressure: comma-separated cells to run, in this order: "+strings.Join(pressureCells, ",")+" (default all)")
	fs.StringVar(&pf.relays, "pressure-relays", "", "pressure: comma-separated relay kinds, one after the other: "+strings.Join(pressureRelayKinds, ",")+" (default all)")
	fs.StringVar(&pf.cellDur, "pressure-cell-duration", "", "pressure: each cell's duration, or cell=duration,... (default clean 2m, xmin 10m, readers 10m, load 2m, kill-busy 2m, kill-idle 2m, pool 2m; --quick 10s, xmin 20s)")
	fs.DurationVar(&pf.recovery, "pressure-recovery", 0, "pressure: the recovery after each cell, at the base rate (default 1m, --quick 5s)")
	fs.IntVar(&pf.rate, "pressure-rate", 0, "pressure: events/s offered, one event per transaction (default 800; the load cell offers 1.5x)")
	fs.IntVar(&pf.aggregates, "pressure-aggregates", 0, "pressure: events go to this many aggregates (default 2000)")
	fs.DurationVar(&pf.killEvery, "pressure-kill-every", 0, "pressure: the kill cells' interval between two pg_terminate_backend rounds (default 1s)")
	fs.BoolVar(&pf.countPending, "pressure-count-pending", false, "pressure: also count the pending rows with count(*) once a second (a monitoring query: itself a load under a pinned xmin)")
	fs.StringVar(&pf.explain, "pressure-explain", "", "pressure: load auto_explain in the private cluster and save its log, with the plan (rows and buffers per node) of every statement slower than --pressure-explain-min, to this file (a diagnosis; it slows every statement a little)")
	fs.DurationVar(&pf.explainMin, "pressure-explain-min", 25*time.Millisecond, "pressure: with --pressure-explain, the shortest statement whose plan is logged")
	fs.StringVar(&o.databaseURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL (env DATABASE_URL)")
	fs.StringVar(&o.natsURL, "nats-url", envOr("NATS_URL", "nats://127.0.0.1:4222"), "NATS with JetStream (env NATS_URL)")
	fs.StringVar(&o.amqpURL, "amqp-url", envOr("AMQP_URL", "amqp://127.0.0.1:5672/"), "RabbitMQ, for the destinations group (env AMQP_URL; no user: guest)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process (in-process relays, writers) to this file")
	fs.StringVar(&o.jsonOut, "json-out", "", "also write the JSON objects to this file (with the table on stdout)")
	fs.StringVar(&o.explainFile, "explain", "", "write the claim's EXPLAIN (ANALYZE, BUFFERS) on the history table to this file")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	o.sz = defaultSizes()
	if o.quick {
		o.sz = quickSizes()
	}
	if o.long {
		o.sz.backlog = 1_000_000
	}
	if backlog > 0 {
		o.sz.backlog, o.sz.aggregates = backlog, max(1, backlog/20)
	}
	var serr error
	if soak.outboxes, serr = parseSoakList("soak-outboxes", soakOutboxes, soakOutboxKinds); serr == nil {
		soak.autovacuum, serr = parseSoakList("soak-autovacuum", soakAV, soakAutovacuums)
	}
	if serr == nil {
		sizing.outboxes, serr = parseSoakList("sizing-outboxes", sizingOutboxes, soakOutboxKinds)
	}
	if serr != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", serr)
		os.Exit(2)
	}
	o.sz.soak = o.sz.soak.override(soak)
	var perr error
	if o.sz.pressure, perr = pf.apply(o.sz.pressure); perr != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", perr)
		os.Exit(2)
	}
	o.sz.sizing = o.sz.sizing.override(sizing)
	if outage > 0 {
		o.sz.outage = outage
	}
	if latencyClients > 0 {
		o.sz.latencyClients = latencyClients
	}
	o.only = allGroups
	if o.quick {
		o.only = quickGroups
	}
	if only != "" {
		o.only = strings.Split(only, ",")
		for _, g := range o.only {
			if !slices.Contains(allGroups, g) && !slices.Contains(extraGroups, g) {
				fmt.Fprintf(os.Stderr, "bench: unknown group %q (groups: %s)\n", g, strings.Join(append(allGroups, extraGroups...), ","))
				os.Exit(2)
			}
		}
	}
	if dests != "" {
		o.dests = strings.Split(dests, ",")
		for _, d := range o.dests {
			if !slices.ContainsFunc(destinations, func(x destination) bool { return x.name == d }) {
				fmt.Fprintf(os.Stderr, "bench: unknown destination %q (destinations: %s)\n", d, destinationNames())
				os.Exit(2)
			}
		}
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := run(ctx, o, os.Stderr)
	if o.json {
		writeJSON(os.Stdout, results)
	} else {
		printTable(os.Stdout, results)
	}
	if o.jsonOut != "" {
		if f, ferr := os.Create(o.jsonOut); ferr == nil {
			writeJSON(f, results)
			_ = f.Close()
		} else {
			fmt.Fprintf(os.Stderr, "bench: %v\n", ferr)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

func writeJSON(w io.Writer, results []Result) {
	enc := json.NewEncoder(w)
	for _, r := range results {
		_ = enc.Encode(r)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// run runs the selected groups and returns every result, also those of the
// groups that ran before an error.
func run(ctx context.Context, o options, logw io.Writer) ([]Result, error) {
	e, err := newEnv(ctx, o, logw)
	if err != nil {
		return nil, err
	}
	defer e.close()
	e.logf("machine: %s", machineLine(ctx, e))
	start := time.Now()
	var all []Result
	for _, g := range o.only {
		var rs []Result
		var err error
		t := time.Now()
		e.logf("== %s", g)
		// Start each group from a clean slate: the previous group's WAL and
		// dirty buffers flushed now rather than by a checkpoint in the middle
		// of this one (pgbench does the same before a run).
		// A smoke run skips it: no figure to protect, seconds to save.
		if e.sz.checkpoint {
			if _, err := e.admin.Exec(ctx, "CHECKPOINT"); err != nil {
				e.logf("checkpoint: %v", err)
			}
		}
		switch g {
		case "write":
			rs, err = benchWrite(ctx, e)
		case "relay":
			rs, err = benchRelay(ctx, e)
		case "latency":
			rs, err = benchLatency(ctx, e)
		case "destinations":
			rs, err = benchDestinations(ctx, e)
		case "scale":
			rs, err = benchScale(ctx, e)
		case "history":
			rs, err = benchHistory(ctx, e)
		case "blocked":
			rs, err = benchBlocked(ctx, e)
		case "idle":
			rs, err = benchIdle(ctx, e)
		case "soak":
			rs, err = benchSoak(ctx, e)
		case "cdc":
			rs, err = benchCDC(ctx, e)
		case "cdc-outage":
			rs, err = benchCDCOutage(ctx, e)
		case "outage":
			rs, err = benchOutage(ctx, e)
		case "pressure":
			rs, err = benchPressure(ctx, e)
		case "inbox":
			rs, err = benchInbox(ctx, e)
		case "sizing":
			rs, err = benchSizing(ctx, e)
		}
		if o.quick {
			smoke(rs)
		}
		all = append(all, rs...)
		if err != nil {
			return all, fmt.Errorf("%s: %w", g, err)
		}
		e.logf("== %s done in %s", g, time.Since(t).Round(time.Second))
	}
	e.logf("all done in %s", time.Since(start).Round(time.Second))
	return all, nil
}

// smoke marks a --quick run's results: no target is checked on them.
func smoke(rs []Result) {
	for i := range rs {
		rs[i].Smoke, rs[i].Met = true, nil
	}
}

func printTable(w io.Writer, rs []Result) {
	if slices.ContainsFunc(rs, func(r Result) bool { return r.Smoke }) {
		fmt.Fprintln(w, "smoke run (--quick): every scenario ran, at sizes too small for figures; no ratio below is a comparison and no target is checked (the figures: cd bench && go run .)")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tevents/s\tp50 ms\tp99 ms\tmax ms\tvalue\tratio\tvs\ttarget\tmet\t")
	num := func(p *float64, prec int) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.*f", prec, *p)
	}
	for _, r := range rs {
		val := "-"
		if r.Value != nil {
			val = fmt.Sprintf("%.1f %s", *r.Value, r.Unit)
		}
		met := ""
		if r.Met != nil {
			met = map[bool]string{true: "yes", false: "NO"}[*r.Met]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Scenario, num(r.EventsPerSec, 0), num(r.P50, 1), num(r.P99, 1),
			num(r.Max, 1), val, num(r.Ratio, 2), r.RatioOf, r.Target, met)
	}
	_ = tw.Flush()
	for _, r := range rs {
		if r.Note != "" {
			fmt.Fprintf(w, "  %s: %s\n", r.Scenario, r.Note)
		}
	}
}
