package chaos

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/examples/orders/ordersdb"
	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// Config configures a chaos run.
type Config struct {
	// Duration is how long commands are driven and faults injected.
	Duration time.Duration
	// Seed drives the fault schedule, the failpoints' probabilities and the
	// command mix.
	Seed uint64
	// DatabaseURL is the PostgreSQL the run makes a schema of its own in.
	DatabaseURL string
	// Bins are the outbox (relays) and orders (API, consumers) executables.
	Bins Binaries
	// Destination is where the relays publish: "nats" (a NATS server of
	// the run's own, restarted by broker faults), "kafka" (franz-go's
	// in-process Kafka cluster, kfake, persisted to the run's directory and
	// restarted by broker faults), "amqp" (a RabbitMQ node of the run's own, restarted by broker
	// faults), "webhook" (the relays POST to the one consumer, which is the
	// endpoint: no broker faults), or the URL of an external broker (never
	// restarted) or of the consumer's webhook.
	// Defaults to "nats".
	Destination string
	// NATSServer is the nats-server executable the run starts (and
	// restarts) as its NATS broker; "" runs an embedded server instead.
	NATSServer string
	// Relays and Consumers are how many of each run. Default to 2.
	Relays, Consumers int
	// CDC runs the relays with --mode cdc (DatabaseURL's server needs
	// wal_level=logical): one streams the group's slot, the others stand
	// by, all run the polling safety net (after CDCReconcileAfter); the
	// CDC stream's boundaries join the failpoints.
	CDC bool
	// Postgres, when set, is the run's own PostgreSQL cluster (the one
	// DatabaseURL names): the schedule then crashes and restarts it.
	Postgres Restartable
	// Clients and Rate shape the traffic: concurrent HTTP clients and
	// commands per second in total. Default to 4 and 30.
	Clients int
	Rate    float64
	// Every is the mean time between two faults. Defaults to 2s.
	Every time.Duration
	// Lease is the relays' lease. Defaults to 2s.
	Lease time.Duration
	// DuplicateWindow is the stream's deduplication window; short, so that
	// republished events reach the consumers twice. Defaults to 500ms.
	DuplicateWindow time.Duration
	// RecoverTimeout bounds the wait, after the faults, for every event to
	// be published and applied. Defaults to 3m.
	RecoverTimeout time.Duration
	// Keep keeps the schema, the broker's storage and the logs.
	Keep bool
	// Out receives the report; Logs the processes' output when Verbose.
	Out, Logs io.Writer
	Verbose   bool
	// Saga runs the order saga too (NATS destinations only): the payment
	// provider in ProviderMode (default idempotent), the payments and the
	// saga consumers, with their faults (kills, the payments' side-effect
	// failpoints, provider faults), and checks I6 and I7.
	Saga         bool
	ProviderMode string
}

func (c Config) withDefaults() Config {
	if c.Relays <= 0 {
		c.Relays = 2
	}
	if c.Consumers <= 0 {
		c.Consumers = 2
	}
	if c.Clients <= 0 {
		c.Clients = 4
	}
	if c.Rate <= 0 {
		c.Rate = 30
	}
	if c.Every <= 0 {
		c.Every = 2 * time.Second
	}
	if c.Lease <= 0 {
		c.Lease = 2 * time.Second
	}
	if c.DuplicateWindow <= 0 {
		c.DuplicateWindow = 500 * time.Millisecond
	}
	if c.RecoverTimeout <= 0 {
		c.RecoverTimeout = 3 * time.Minute
	}
	if c.Destination == "" {
		c.Destination = "nats"
	}
	if c.ProviderMode == "" {
		c.ProviderMode = string(provider.ModeIdempotent)
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Logs == nil {
		c.Logs = io.Discard
	}
	return c
}

// Restartable is a server the run may crash and start again.
type Restartable interface {
	Crash() error
	Start() error
}

// CDCReconcileAfter is the relays' --reconcile-after in a CDC run: short,
// so that the safety net's share (events left by a killed stream) shows in
// a short run.
const CDCReconcileAfter = 3 * time.Second

// ScheduleConfig is the schedule of a run of c over the members, without
// broker restarts when noBroker.
func (c Config) ScheduleConfig(members []string, noBroker bool) ScheduleConfig {
	c = c.withDefaults()
	sc := ScheduleConfig{Seed: c.Seed, Duration: c.Duration, Members: members, Every: c.Every, Lease: c.Lease, NoBroker: noBroker}
	if c.CDC {
		sc.RelayFailpoints = CDCRelayFailpoints
	}
	sc.Postgres = c.Postgres != nil
	sc.Saga = c.Saga
	return sc
}

// Stats count what the run did to the system.
type Stats struct {
	// Killed counts SIGKILLs sent by the run (kill faults, and restarts to
	// arm a failpoint); CrashedAtFailpoint counts processes that killed
	// themselves at a crash failpoint.
	Killed, CrashedAtFailpoint int
	// FailpointsArmed counts restarts with a rule; FailpointsFired counts the
	// firings the processes reported, per action.
	FailpointsArmed int
	FailpointsFired map[string]int
	// BrokerRestarts, Pauses and Disarmed (clean SIGTERM restarts after a
	// rule's time) count the other faults.
	BrokerRestarts, Pauses, Disarmed int
	// ErrorExits counts processes that exited with an error by themselves
	// (an order service or consumer started while the broker was down, say; relays wait instead).
	ErrorExits int
	// DuplicatesSuppressed counts the consumers' "duplicate delivery
	// suppressed" lines; OutOfOrder their out-of-order anomalies.
	DuplicatesSuppressed, OutOfOrder int
	// Recovery is how long convergence took after the faults ended.
	Recovery time.Duration
	// PostgresRestarts counts the PostgreSQL crashes and restarts;
	// SlotFaults the WAL switches and checkpoints meant to invalidate the
	// CDC slot, SlotInvalidations the relays' reports of a slot found
	// invalidated and recreated.
	PostgresRestarts, SlotFaults, SlotInvalidations int
	// CDCStreams counts the relays' "cdc streaming" lines (a relay started
	// streaming the slot), CDCTakeovers those by a relay that stood by.
	CDCStreams, CDCTakeovers int
	// ProviderFaults counts the provider faults set (saga runs).
	ProviderFaults int
}

// Result is a finished run.
type Result struct {
	Seed     uint64
	Schedule Schedule
	Report   *Report
	Stats    Stats
	LogDir   string
}

// run is one chaos run in progress.
type run struct {
	pool  *pgxpool.Pool // the run's own connections, for faults that are SQL
	cfg   Config
	where Where
	sys   *System
	dest  Destination
	sched Schedule
	start time.Time

	opMu  sync.Mutex // one change to the members at a time
	stats Stats
	smu   sync.Mutex

	fired      [3]atomic.Int64 // crash, error, sleep
	duplicates atomic.Int64
	outOfOrder atomic.Int64
	// cdcStreams and cdcTakeovers count the relays' "cdc streaming" and
	// "took over the slot" lines.
	cdcStreams, cdcTakeovers, cdcInvalidations atomic.Int64
}

func (r *run) count(f func(s *Stats)) {
	r.smu.Lock()
	defer r.smu.Unlock()
	f(&r.stats)
}

func (r *run) printf(format string, args ...any) { fmt.Fprintf(r.cfg.Out, format, args...) }

// Run runs the order system as processes (one API, cfg.Relays relays,
// cfg.Consumers inventory consumers sharing one durable consumer or group)
// on a schema and a stream or topic of its own (on a broker of its own
// unless cfg.Destination is a URL), drives commands for cfg.Duration while
// injecting the seed's faults, lets everything recover, and checks the
// invariants. It prints its progress and report to cfg.Out and returns an
// error when an invariant was violated (or the run could not be done).
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	cfg = cfg.withDefaults()
	var suffix [3]byte
	_, _ = rand.Read(suffix[:])
	tag := fmt.Sprintf("%d_%x", cfg.Seed, suffix)
	r := &run{cfg: cfg, where: Where{Schema: "chaos_" + tag, Saga: cfg.Saga}.withDefaults()}
	res = &Result{Seed: cfg.Seed}

	logDir, err := os.MkdirTemp("", "outbox-chaos-")
	if err != nil {
		return res, err
	}
	res.LogDir = logDir
	logFile, err := os.Create(filepath.Join(logDir, "processes.log"))
	if err != nil {
		return res, err
	}
	defer func() {
		logFile.Close()
		if err == nil && !cfg.Keep {
			_ = os.RemoveAll(logDir)
		} else {
			r.printf("logs kept in %s\n", logDir)
		}
	}()
	var logMu sync.Mutex
	sink := func(name, line string) {
		r.scan(line)
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(logFile, "%-12s| %s\n", name, line)
		if cfg.Verbose {
			fmt.Fprintf(cfg.Logs, "%-12s| %s\n", name, line)
		}
	}

	// PostgreSQL: a schema of the run's own, with every part's tables.
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("database url: %w", err)
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, fmt.Errorf("connect to database: %w", err)
	}
	defer pool.Close()
	r.pool = pool
	if _, err := outboxmigrate.Migrate(ctx, pool, r.where.Schema); err != nil {
		return res, err
	}
	defer func() {
		if cfg.Keep {
			r.printf("kept schema %s\n", r.where.Schema)
			return
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, derr := pool.Exec(dctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{r.where.Schema}.Sanitize()+" CASCADE"); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop schema %s: %w", r.where.Schema, derr))
		}
	}()
	for _, set := range []ordersdb.Set{ordersdb.Orders, ordersdb.Inventory, ordersdb.Payments} {
		if _, err := ordersdb.Migrate(ctx, pool, r.where.Schema, set); err != nil {
			return res, err
		}
	}

	// The destination, with the stream or topic created up front (a short
	// dedup window on NATS).
	if r.dest, err = OpenDestination(ctx, DestinationConfig{Spec: cfg.Destination, Tag: "chaos_" + tag,
		Dir: filepath.Join(logDir, "broker"), NATSServer: cfg.NATSServer, DuplicateWindow: cfg.DuplicateWindow, Sink: sink,
		DatabaseURL: cfg.DatabaseURL, Schema: r.where.Schema}); err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, r.dest.Close(cfg.Keep)) }()
	consumers, fewer := maxConsumers(r.dest, cfg.Consumers)
	if cfg.Saga && !sagaDestination(r.dest) {
		return res, fmt.Errorf("the saga runs on NATS only (its consumers read JetStream), not on %s", r.dest.Name())
	}

	var ports [3]int
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return res, err
		}
	}
	var relayArgs []string
	if cfg.CDC {
		relayArgs = []string{"--mode", "cdc", "--reconcile-after", CDCReconcileAfter.String()}
	}
	r.sys = NewSystem(SystemConfig{
		Bins: cfg.Bins, DatabaseURL: cfg.DatabaseURL, Schema: r.where.Schema,
		Destination: r.dest, APIPort: ports[0],
		Relays: cfg.Relays, Consumers: consumers, Lease: cfg.Lease, AckWait: 2 * time.Second, Sink: sink,
		Saga: cfg.Saga, ProviderMode: cfg.ProviderMode, ProviderPort: ports[1], ProviderControlPort: ports[2],
		RelayArgs: relayArgs,
	})
	defer r.sys.KillAll()
	r.sched = NewSchedule(cfg.ScheduleConfig(r.sys.Names(), !r.dest.Restartable()))
	res.Schedule = r.sched

	r.printf("outbox chaos: seed %d, %s of faults\n", cfg.Seed, cfg.Duration)
	r.printf("  processes: %s (orders %s, outbox %s)\n", strings.Join(r.sys.Names(), ", "), cfg.Bins.Orders, cfg.Bins.Outbox)
	r.printf("  destination: %s; schema %s\n", r.dest.Describe(), r.where.Schema)
	if cfg.CDC {
		r.printf("  relays in cdc mode: one streams the slot, the others stand by; polling safety net after %s\n", CDCReconcileAfter)
	}
	if fewer != "" {
		r.printf("  %d consumer process instead of %d: %s\n", consumers, cfg.Consumers, fewer)
	}
	if !r.dest.Restartable() {
		r.printf("  no broker restarts: %s\n", noRestartsNote(r.dest))
	}
	r.printf("  schedule %s: %d faults (%d kills, %d failpoints, %d pauses, %d broker restarts, %d postgres restarts, %d slot invalidations)\n", r.sched.Digest(), len(r.sched),
		r.sched.Count(FaultKill), r.sched.Count(FaultFailpoint), r.sched.Count(FaultPause), r.sched.Count(FaultBroker), r.sched.Count(FaultPostgres), r.sched.Count(FaultSlot))
	if cfg.Saga {
		r.printf("  saga: provider mode %s, %d provider faults (%s)\n", cfg.ProviderMode, r.sched.Count(FaultProvider), strings.Join(ProviderFaults, ", "))
	}

	for _, n := range r.sys.Names() {
		if err := r.sys.Start(n, "", 0); err != nil {
			return res, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = r.sys.WaitAPI(wctx)
	cancel()
	if err != nil {
		return res, err
	}

	driver := NewDriver(r.sys.APIURL(), tag, cfg.Seed, DefaultMix)
	defer driver.Close()
	r.start = time.Now()
	runCtx, stopRun := context.WithTimeout(ctx, cfg.Duration)
	defer stopRun()
	superCtx, stopSuper := context.WithCancel(ctx)
	defer stopSuper()
	superDone := make(chan struct{})
	go func() { defer close(superDone); r.supervise(superCtx) }()
	var wg sync.WaitGroup
	wg.Go(func() { driver.Run(runCtx, cfg.Clients, cfg.Rate, 0) })
	wg.Go(func() { r.inject(runCtx) })
	wg.Go(func() { r.progress(runCtx, pool, driver) })
	wg.Wait()
	if ctx.Err() != nil {
		return res, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	// The driver has stopped; a request it cancelled may still be
	// committing in the API (its transactions are waited for below).
	var driverStopped time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&driverStopped); err != nil {
		return res, err
	}

	// Recovery: broker up, nothing paused or armed, every process running.
	r.printf("[%5.1fs] faults over; recovering\n", r.elapsed())
	recStart := time.Now()
	r.opMu.Lock()
	if err := r.dest.Start(ctx); err != nil {
		r.opMu.Unlock()
		return res, err
	}
	for _, n := range r.sys.Names() {
		r.sys.Resume(n)
		if running, _, fps, _ := r.sys.State(n); !running || fps != "" {
			if err := r.sys.Start(n, "", 0); err != nil {
				r.opMu.Unlock()
				return res, err
			}
		}
	}
	r.opMu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, cfg.RecoverTimeout)
	if cfg.Saga {
		r.clearProviderFaults(rctx)
	}
	convErr := WaitWritesEnded(rctx, pool, r.sys.AppName(RoleAPI), driverStopped)
	var progress Progress
	if convErr == nil {
		progress, convErr = WaitConverged(rctx, pool, r.dest, r.where)
	}
	if convErr == nil && cfg.Saga {
		r.printf("[%5.1fs] order events published and applied; waiting for the sagas to settle\n", r.elapsed())
		_, convErr = WaitSagaSettled(rctx, pool, r.where, r.ledger, provider.Mode(cfg.ProviderMode))
	}
	cancel()
	r.stats.Recovery = time.Since(recStart)
	if convErr != nil {
		r.printf("[%5.1fs] NOT RECOVERED within %s: %v\n", r.elapsed(), cfg.RecoverTimeout, convErr)
	} else {
		r.printf("[%5.1fs] recovered in %s: %s\n", r.elapsed(), r.stats.Recovery.Round(time.Millisecond), progress)
	}
	stopSuper()
	<-superDone

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := driver.Ledger.Resolve(cctx, pool, r.where.Schema); err != nil {
		return res, err
	}
	report, err := Check(cctx, pool, r.dest, r.where, driver.Ledger, int(r.outOfOrder.Load()))
	if err != nil {
		return res, err
	}
	if cfg.Saga {
		l, err := r.ledger(cctx)
		if err != nil {
			return res, fmt.Errorf("provider ledger: %w", err)
		}
		if err := CheckSaga(cctx, pool, r.where, l, provider.Mode(cfg.ProviderMode), report); err != nil {
			return res, err
		}
	}
	res.Report = report
	for _, bad := range r.sys.StopAll(15 * time.Second) {
		r.printf("  unclean stop: %s\n", bad)
	}
	r.finishStats()
	res.Stats = r.stats
	r.report(res)
	if n := report.Total(); n > 0 {
		return res, fmt.Errorf("%d invariant violations (seed %d)", n, cfg.Seed)
	}
	return res, nil
}

func (r *run) elapsed() float64 { return time.Since(r.start).Seconds() }

// scan counts what the processes report in their output.
func (r *run) scan(line string) {
	switch {
	case strings.HasPrefix(line, "failpoint "):
		switch {
		case strings.Contains(line, ": crash"):
			r.fired[0].Add(1)
		case strings.Contains(line, ": error"):
			r.fired[1].Add(1)
		case strings.Contains(line, ": sleep"):
			r.fired[2].Add(1)
		}
	case strings.Contains(line, "duplicate delivery suppressed"):
		r.duplicates.Add(1)
	case strings.Contains(line, `msg="cdc streaming"`):
		r.cdcStreams.Add(1)
	case strings.Contains(line, `msg="took over the slot`):
		r.cdcTakeovers.Add(1)
	case strings.Contains(line, `msg="replication slot invalidated by PostgreSQL`):
		r.cdcInvalidations.Add(1)
	case strings.Contains(line, "cancellation found no reservation"):
		r.outOfOrder.Add(1)
	}
}

func (r *run) finishStats() {
	r.stats.FailpointsFired = map[string]int{"crash": int(r.fired[0].Load()), "error": int(r.fired[1].Load()), "sleep": int(r.fired[2].Load())}
	r.stats.DuplicatesSuppressed = int(r.duplicates.Load())
	r.stats.CDCStreams, r.stats.CDCTakeovers = int(r.cdcStreams.Load()), int(r.cdcTakeovers.Load())
	r.stats.SlotInvalidations = int(r.cdcInvalidations.Load())
	r.stats.OutOfOrder = int(r.outOfOrder.Load())
	r.stats.BrokerRestarts = r.dest.Restarts()
	for _, x := range r.sys.Exits() {
		switch {
		case x.Failpoint != "":
			r.stats.CrashedAtFailpoint++
		case !x.ByHarness && x.Signal == 0 && x.Err != nil:
			r.stats.ErrorExits++
		}
	}
}

// supervise restarts, without failpoints, every member that has been down
// for 300ms, until ctx ends.
func (r *run) supervise(ctx context.Context) {
	down := map[string]time.Time{}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.opMu.Lock()
		for _, n := range r.sys.Names() {
			if running, _, _, _ := r.sys.State(n); running {
				delete(down, n)
				continue
			}
			since, ok := down[n]
			if !ok {
				down[n] = time.Now()
				continue
			}
			if time.Since(since) >= 300*time.Millisecond {
				if err := r.sys.Start(n, "", 0); err != nil {
					r.printf("  restart %s: %v\n", n, err)
				}
				delete(down, n)
			}
		}
		r.opMu.Unlock()
	}
}

// inject applies the schedule's faults at their times until ctx ends.
func (r *run) inject(ctx context.Context) {
	var pending sync.WaitGroup
	defer pending.Wait()
	for i, f := range r.sched {
		t := time.NewTimer(time.Until(r.start.Add(f.At)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		switch f.Kind {
		case FaultKill:
			r.opMu.Lock()
			if r.sys.Kill(f.Target) {
				r.count(func(s *Stats) { s.Killed++ })
			}
			r.opMu.Unlock()
		case FaultFailpoint:
			r.opMu.Lock()
			running, _, _, _ := r.sys.State(f.Target)
			err := r.sys.Start(f.Target, f.Rule, r.cfg.Seed+uint64(i))
			_, inc, _, _ := r.sys.State(f.Target)
			r.opMu.Unlock()
			if err != nil {
				r.printf("  arm %s on %s: %v\n", f.Rule, f.Target, err)
				continue
			}
			r.count(func(s *Stats) {
				s.FailpointsArmed++
				if running {
					s.Killed++
				}
			})
			pending.Go(func() {
				if !sleepCtx(ctx, f.For) {
					return // recovery restarts it clean
				}
				r.opMu.Lock()
				running, now, fps, _ := r.sys.State(f.Target)
				r.opMu.Unlock()
				if running && now == inc && fps == f.Rule {
					_ = r.sys.Stop(f.Target, 10*time.Second)
					r.count(func(s *Stats) { s.Disarmed++ })
				}
			})
		case FaultPause:
			r.opMu.Lock()
			ok := r.sys.Pause(f.Target)
			r.opMu.Unlock()
			if !ok {
				continue
			}
			r.count(func(s *Stats) { s.Pauses++ })
			pending.Go(func() {
				sleepCtx(ctx, f.For)
				r.sys.Resume(f.Target)
			})
		case FaultPostgres:
			if err := r.cfg.Postgres.Crash(); err != nil {
				r.printf("  crash PostgreSQL: %v\n", err)
				continue
			}
			r.count(func(s *Stats) { s.PostgresRestarts++ })
			pending.Go(func() {
				sleepCtx(ctx, f.For) // started again even when the faults end first
				if err := r.cfg.Postgres.Start(); err != nil {
					r.printf("  start PostgreSQL: %v\n", err)
				}
			})
		case FaultSlot:
			if err := r.invalidateSlot(ctx); err != nil {
				r.printf("  invalidate the slot: %v\n", err)
				continue
			}
			r.count(func(s *Stats) { s.SlotFaults++ })
		case FaultProvider:
			r.provider(ctx, f, &pending)
		case FaultBroker:
			if err := r.dest.Stop(); err != nil {
				r.printf("  stop the broker: %v\n", err)
			}
			pending.Go(func() {
				if sleepCtx(ctx, f.For) {
					if err := r.dest.Start(context.WithoutCancel(ctx)); err != nil {
						r.printf("  start the broker: %v\n", err)
					}
				}
			})
		}
	}
}

// invalidateSlot moves the WAL on by two segments and checkpoints: on a
// cluster with a tiny max_slot_wal_keep_size, PostgreSQL then invalidates
// a slot whose restart position is in an older segment (a CDC slot almost
// always is), terminating the relay that streams it.
func (r *run) invalidateSlot(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		if _, err := r.pool.Exec(ctx, "SELECT pg_switch_wal()"); err != nil {
			return err
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	_, err := r.pool.Exec(ctx, "CHECKPOINT")
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// progress prints a line every 10s until ctx ends.
func (r *run) progress(ctx context.Context, pool *pgxpool.Pool, d *Driver) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		p, err := GetProgress(qctx, pool, r.dest, r.where)
		cancel()
		if ctx.Err() != nil {
			return
		}
		state := p.String()
		if err != nil {
			state = "progress unknown: " + err.Error()
		}
		r.smu.Lock()
		killed := r.stats.Killed
		r.smu.Unlock()
		r.printf("[%5.1fs] %d commands committed | %s | killed %d, failpoints fired %d, broker restarts %d\n",
			r.elapsed(), d.Ledger.Committed(), state, killed,
			r.fired[0].Load()+r.fired[1].Load()+r.fired[2].Load(), r.dest.Restarts())
	}
}

// report prints one line per figure and per invariant.
func (r *run) report(res *Result) {
	rep, s := res.Report, res.Stats
	line := func(name string, v any, note string) { Line(r.cfg.Out, name, v, note) }
	fired := s.FailpointsFired["crash"] + s.FailpointsFired["error"] + s.FailpointsFired["sleep"]
	r.printf("\n")
	rep.WriteFigures(r.cfg.Out)
	line("duplicates suppressed", s.DuplicatesSuppressed, "by the inbox (counted from the consumers' logs)")
	line("processes killed", s.Killed+s.CrashedAtFailpoint, fmt.Sprintf("SIGKILL: %d by chaos, %d at a crash failpoint", s.Killed, s.CrashedAtFailpoint))
	line("failpoints armed", s.FailpointsArmed, fmt.Sprintf("%d disarmed by a clean restart", s.Disarmed))
	line("failpoints fired", fired, fmt.Sprintf("crash %d, error %d, sleep %d", s.FailpointsFired["crash"], s.FailpointsFired["error"], s.FailpointsFired["sleep"]))
	line("relays paused", s.Pauses, "SIGSTOP past the lease, then SIGCONT")
	if r.dest.Restartable() {
		line("broker restarts", s.BrokerRestarts, "")
	} else {
		line("broker restarts", s.BrokerRestarts, "none: "+noRestartsNote(r.dest))
	}
	line("process error exits", s.ErrorExits, "exited by themselves (e.g. started while the broker was down), restarted")
	if r.cfg.Postgres != nil {
		line("postgres restarts", s.PostgresRestarts, "crashed (immediate shutdown) and started again")
		line("slot invalidations", s.SlotInvalidations, fmt.Sprintf("CDC slot found invalidated and recreated by a relay, after %d WAL switches+checkpoints", s.SlotFaults))
	}
	if r.cfg.CDC {
		line("cdc streams", s.CDCStreams, fmt.Sprintf("times a relay started streaming the slot; %d after standing by", s.CDCTakeovers))
	}
	line("recovery", s.Recovery.Round(time.Millisecond), "from the end of the faults to all published and applied")
	if rep.Saga != nil {
		line("provider faults", s.ProviderFaults, "timeouts after commit, dropped responses, 500 after commit (control listener)")
	}
	rep.WriteSaga(r.cfg.Out)
	rep.WriteViolations(r.cfg.Out)
	if n := rep.Total(); n > 0 {
		r.printf("seed %d: FAILED, %d violations (schedule %s)\n", res.Seed, n, res.Schedule.Digest())
	} else {
		r.printf("seed %d: all invariants hold (schedule %s)\n", res.Seed, res.Schedule.Digest())
	}
}
