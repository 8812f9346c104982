package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/examples/orders/payments"
	"github.com/pgoutbox/outbox/internal/chaos"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/redact"
	"github.com/pgoutbox/outbox/outboxamqp"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxnats"
)

type demoFlags struct {
	partitioned bool
	databaseURL string
	dest        destination.Options
	orders      int
	concurrency int
	keep        bool
	timeout     time.Duration
	lostAcks    float64
	seed        uint64
	verbose     bool
	mode        string // polling or cdc
	writer      string // go or sql: how the order API records its events
	postgres    string // auto, url or private (demo_postgres.go)
	urlSource   string // where databaseURL came from: --database-url, DATABASE_URL, or "" (the default address)
	// The saga (demo_saga.go).
	noSaga         bool
	providerMode   string
	providerFaults string
	blindRetry     bool
}

func runDemo(ctx context.Context, args []string) error {
	return demo(ctx, args, os.Stdout, os.Stderr)
}

// demo parses args and runs the demo, writing its progress and report to
// out and the components' logs to logs.
func demo(ctx context.Context, args []string, out, logs io.Writer) error {
	fs := cli.NewFlagSet("outbox", "demo", `demo [flags]

Runs the example order system in this process: the order HTTP API, the relay
and the inventory consumer, on PostgreSQL (--postgres) and the destination
--destination names: "nats" (the default: an embedded NATS JetStream server),
"kafka" (franz-go's in-process Kafka-protocol cluster, kfake: the relay and the
consumer speak the Kafka protocol to it as to any Kafka), "amqp" (the machine's
RabbitMQ at amqp://guest:guest@127.0.0.1:5672/), "webhook" (the relay POSTs each
event, signed with a secret of the run's own, to the consumer's HTTP server on a
free port; what the consumer accepted is what is "at the destination"), or the URL
of an external broker (nats://host:port, kafka://host:port,
amqp://user:password@host:port/), or http://host:port/path for the consumer's
webhook server. It drives commands over HTTP
with the chaos harness's driver (creates, cancellations, rollbacks,
idempotent retries, reused keys), waits until every committed event was
published and applied, prints a report and checks the invariants I1-I5 with
the same checker as "outbox chaos". On NATS it also runs the order saga
(docs/saga.md): a fake payment provider (--provider-mode, dropping 5% of its
responses: --provider-faults), the payments consumer charging and refunding
through the side-effect helper, and the saga consumer confirming or cancelling
the orders; it waits until every saga settled and checks I6 (no order charged
twice, from the provider's ledger; a figure in mode neither) and I7 (every
order confirmed, cancelled with nothing charged, or parked with a reason).
In mode neither the provider can neither deduplicate nor be asked, so a call
whose outcome is unknown is parked for an operator (the documented default,
docs/side-effects.md; the order's saga counts as parked); --blind-retry calls
again instead, a counted possible duplicate charge, and I7 is then checked in
its relaxed form (an order may be captured twice), named so on its line.
The faults the demo injects (the dropped consumer acks of --lost-acks, the
provider's --provider-faults) are labelled injected=true in the log lines they
cause. Each run uses a fresh schema and stream
(with its subject prefix), topic, or exchange (with its queues) of its own, removed at
the end unless --keep.

PostgreSQL (--postgres): "auto" (the default) uses DATABASE_URL or
--database-url when set, and fails within 5s, naming it, when that server does
not answer; when neither is set, it uses the server at the default address
(postgres://postgres@127.0.0.1:5432/postgres) when PostgreSQL 13 or newer
answers there and lets the demo in without a password, and otherwise starts a
private cluster of its own on a free port, saying why in one line (nothing
answers, not PostgreSQL, wants a password, too old). The server must be
PostgreSQL 13 or newer. "url" always uses
the URL (or the default address), "private" always starts a private cluster. A
private cluster is made from the machine's PostgreSQL server binaries (initdb,
pg_ctl: found in PG_BINDIR, pg_config --bindir, /usr/lib/postgresql/<version>/bin,
Homebrew's opt/postgresql@<version>/bin, or on the PATH), in a temporary data
directory the demo prints, and is removed at the end; --keep stops it and keeps
its directory, printing how to start it again.
--mode cdc runs the relay as change-data capture (package outboxcdc: a logical
replication slot feeds committed events to the relay, with a polling safety net).
It needs wal_level=logical: with --postgres auto and no DATABASE_URL it runs on a
private cluster with it; on the server DATABASE_URL names it removes its slot and
publication at the end (unless --keep).
--writer sql makes the order API record its events as a service in any other
language would: a plain SQL call of the outbox schema's enqueue function
(docs/sql-api.md) in the order's transaction, instead of the Go outbox.Writer;
the relay, the consumers, the saga and the checks are the same.
--partitioned makes the demo's outbox_events partitioned (outbox migrate --partitioned, one-minute
partitions) before the run: the relay's upkeep keeps partitions ahead, and the checks are the same.
Exits non-zero if a check fails.`)
	var f demoFlags
	cli.DatabaseURLFlag(fs, &f.databaseURL)
	fs.StringVar(&f.dest.URL, "destination", cli.Env("OUTBOX_DESTINATION", "nats"), "nats (an embedded server), kafka (an in-process kfake cluster), amqp (the machine's RabbitMQ), webhook (the consumer's HTTP server on a free port), or a URL: nats://host:port, kafka://host:port, amqp://user:password@host:port/, http://host:port/path (env OUTBOX_DESTINATION)")
	cli.RedactDefault(fs, "destination", destination.Redact)
	fs.StringVar(&f.dest.Source, "source", cli.Env("OUTBOX_SOURCE", outboxnats.SourceDefault), "CloudEvents source attribute (env OUTBOX_SOURCE)")
	fs.IntVar(&f.orders, "orders", 200, "commands to send: order creates, and cancellations, rollbacks and retries among them")
	fs.IntVar(&f.concurrency, "concurrency", 8, "concurrent HTTP clients")
	fs.BoolVar(&f.keep, "keep", false, "keep the schema and the stream or topic at the end, to inspect them (and a private cluster's data directory, stopped)")
	fs.DurationVar(&f.timeout, "timeout", 60*time.Second, "give up when the run has not converged after this long")
	fs.Float64Var(&f.lostAcks, "lost-acks", 0.05, "fraction of consumer acks dropped after the commit (failpoint consumer/after-commit-before-ack), so redeliveries show the inbox deduplicating; ignored when OUTBOX_FAILPOINTS is set")
	fs.Uint64Var(&f.seed, "seed", 0, "seed of the command mix (0: random)")
	fs.BoolVar(&f.verbose, "verbose", false, "log the components' info messages too")
	fs.StringVar(&f.mode, "mode", "polling", "relay mode: polling, or cdc (needs wal_level=logical: a private cluster unless DATABASE_URL is set)")
	fs.StringVar(&f.writer, "writer", ordersapi.WriterGo, "how the order API records its events: go (outbox.Writer) or sql (a plain SQL call of the enqueue function in the order's transaction, as from any language: docs/sql-api.md)")
	fs.StringVar(&f.postgres, "postgres", postgresAuto, "which PostgreSQL: auto (DATABASE_URL when set; else the default address when PostgreSQL 13+ lets the demo in there; else a private cluster), url (DATABASE_URL, --database-url or the default address, never a private cluster), or private (a private cluster from the machine's server binaries, removed at the end unless --keep)")
	fs.BoolVar(&f.noSaga, "no-saga", false, "run without the order saga (payment provider, payments and saga consumers); a non-NATS destination runs without it anyway")
	fs.StringVar(&f.providerMode, "provider-mode", "idempotent", "the payment provider's mode: idempotent, queryable (I6 checked in both) or neither (an unknown outcome parked for an operator, unless --blind-retry; duplicate charges reported as a figure)")
	fs.StringVar(&f.providerFaults, "provider-faults", "drop-response:p=0.05", "faults of the payment provider, as 'orders provider --fault' takes them, ';'-separated (\"\": none); a dropped response is an ambiguous outcome the payments consumer resolves")
	fs.BoolVar(&f.partitioned, "partitioned", false, "partition the demo's outbox_events (one-minute partitions, as 'outbox migrate --partitioned --partition-interval 1m' makes them) before the run")
	fs.BoolVar(&f.blindRetry, "blind-retry", false, "with --provider-mode neither: call the provider again after an unknown outcome (a counted blind retry, a possible duplicate charge; I7 checked in its relaxed form) instead of parking the call for an operator")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	switch {
	case f.blindRetry && f.providerMode != "neither":
		return cli.Usagef(fs, "--blind-retry goes with --provider-mode neither (the other modes resolve an unknown outcome with the same key)")
	case f.orders < 1:
		return fmt.Errorf("--orders %d must be positive", f.orders)
	case f.concurrency < 1:
		return fmt.Errorf("--concurrency %d must be positive", f.concurrency)
	case f.timeout <= 0:
		return fmt.Errorf("--timeout %s must be positive", f.timeout)
	case f.lostAcks < 0 || f.lostAcks >= 1:
		return fmt.Errorf("--lost-acks %g must be in [0,1)", f.lostAcks)
	case f.mode != modePolling && f.mode != modeCDC:
		return cli.Usagef(fs, "--mode %q: want polling or cdc", f.mode)
	case f.writer != ordersapi.WriterGo && f.writer != ordersapi.WriterSQL:
		return cli.Usagef(fs, "--writer %q: want go or sql", f.writer)
	case f.postgres != postgresAuto && f.postgres != postgresURL && f.postgres != postgresPrivate:
		return cli.Usagef(fs, "--postgres %q: want auto, url or private", f.postgres)
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.urlSource = urlSource(set); f.urlSource == "" {
		f.databaseURL = defaultDatabaseURL()
	}
	if f.seed == 0 {
		f.seed = rand.Uint64()%1_000_000 + 1
	}
	if f.dest.URL == "" {
		f.dest.URL = "nats"
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	// The components log through injectedHandler: a line an injected fault
	// caused says so (demo_injected.go).
	d := &demoRun{flags: f, out: out, log: slog.New(newInjectedHandler(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: level})))}
	return d.run(ctx)
}

// writerDescription says in the run's header how the order API records
// its events (--writer).
var writerDescription = map[string]string{
	ordersapi.WriterGo:  "the Go outbox.Writer (--writer go)",
	ordersapi.WriterSQL: "plain SQL, SELECT ... FROM <schema>.enqueue(...) in the order's transaction (--writer sql)",
}

// demoRun is one run of the demo.
type demoRun struct {
	flags demoFlags
	out   io.Writer
	outMu sync.Mutex
	log   *slog.Logger
	start time.Time

	where    chaos.Where
	pg       *demoPostgres
	dest     chaos.Destination
	pool     *pgxpool.Pool
	api      *ordersapi.Service
	relay    *outbox.Relay
	cdc      *outboxcdc.Relay // --mode cdc; relay is then its safety net
	closePub func()
	consumer *inventory.Consumer
	driver   *chaos.Driver
	saga     *demoSaga // nil without the saga
}

func (d *demoRun) printf(format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(d.out, format, args...)
}

func (d *demoRun) run(ctx context.Context) (err error) {
	d.start = time.Now()
	suffix := strings.ReplaceAll(uuid.NewString(), "-", "")[:10]
	d.where = chaos.Where{Schema: "demo_" + suffix}
	// PostgreSQL first: a server that does not answer fails the run before
	// anything else starts.
	if d.pg, err = d.openPostgres(ctx); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.pg.close(d)) }()
	d.flags.databaseURL = d.pg.url

	// The destination: a broker of the demo's own (an embedded NATS server
	// storing in a temporary directory, or an in-process Kafka cluster), or
	// an external one; with the run's stream or topic.
	dir, err := os.MkdirTemp("", "outbox-demo-broker-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	d.dest, err = chaos.OpenDestination(ctx, chaos.DestinationConfig{Spec: d.flags.dest.URL, Tag: "demo_" + suffix,
		Dir: dir, DuplicateWindow: outboxnats.DuplicateWindowDefault, AMQPURL: outboxamqp.URLDefault,
		DatabaseURL: d.flags.databaseURL, Schema: d.where.Schema})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.dest.Close(d.flags.keep)) }()
	d.printf("outbox demo: %d commands, seed %d\n  postgres schema %s\n  destination: %s\n  order API writes events with: %s\n",
		d.flags.orders, d.flags.seed, d.where.Schema, d.dest.Describe(), writerDescription[d.flags.writer])

	pcfg, err := pgxpool.ParseConfig(d.flags.databaseURL)
	if err != nil {
		return redact.Error(fmt.Errorf("database url: %w", err), redact.DatabaseSecrets(d.flags.databaseURL)...)
	}
	pcfg.MaxConns = int32(d.flags.concurrency+inventory.WorkersDefault+6) + payments.PoolSize(payments.WorkersDefault)
	if d.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer d.pool.Close()
	if err := d.pool.Ping(ctx); err != nil {
		return redact.Error(fmt.Errorf("connect to database %s:%d: %w", pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, err), redact.DatabaseSecrets(d.flags.databaseURL)...)
	}
	if err := pgident.ValidateSchema(d.where.Schema); err != nil {
		return err
	}
	// Registered after the pool, so it runs while the pool is still open.
	defer func() { err = errors.Join(err, d.removeOrKeep(context.WithoutCancel(ctx))) }()

	defer func() {
		if d.closePub != nil {
			d.closePub()
		}
	}()
	defer setEnv(append(chaos.DestinationEnv(d.dest, chaos.RoleRelay), chaos.DestinationEnv(d.dest, chaos.RoleConsumer)...))()
	d.where.Saga = !d.flags.noSaga && sagaSupported(d.dest)
	d.where.BlindRetry = d.flags.blindRetry
	if err := d.setUp(ctx); err != nil {
		return err
	}
	if d.where.Saga {
		if err := d.setUpSaga(ctx); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, d.saga.close()) }()
	}

	// The lost acks: the failpoint between the consumer's commit and its ack.
	if os.Getenv(failpoint.EnvVar) == "" && d.flags.lostAcks > 0 {
		spec := fmt.Sprintf("%s=error%%%g", inventory.FailpointAfterCommitBeforeAck, d.flags.lostAcks)
		if err := failpoint.Enable(spec, d.flags.seed); err != nil {
			return err
		}
		defer func() { _ = failpoint.Enable("", 0) }()
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(runCtx)
	// The consumer first: on a webhook it is the endpoint the relay's
	// publisher waits for.
	g.Go(func() error { return componentDone("inventory consumer", gctx, d.consumer.Run(gctx, d.dest.URL())) })
	if err := d.setUpRelay(gctx); err != nil {
		stop()
		return errors.Join(err, g.Wait())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: d.api.Handler(), ReadHeaderTimeout: 10 * time.Second}
	baseURL := "http://" + ln.Addr().String()
	d.driver = chaos.NewDriver(baseURL, suffix, d.flags.seed, chaos.DefaultMix)
	defer d.driver.Close()
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("order API: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	if d.cdc != nil {
		g.Go(func() error { return componentDone("cdc relay", gctx, d.cdc.Run(gctx)) })
	} else {
		g.Go(func() error { return componentDone("relay", gctx, d.relay.Run(gctx)) })
	}
	d.printf("  order API %s, relay %s, inventory consumer (durable consumer or group %s, %d workers) running\n",
		baseURL, d.relay.ID(), inventory.DurableDefault, inventory.WorkersDefault)
	if d.saga != nil {
		d.runSaga(gctx, g)
		d.printf("  saga: payment provider (mode %s), payments consumer, saga consumer running%s\n", d.saga.mode, neitherNote(d.saga.mode, d.flags.blindRetry))
	} else {
		d.printf("  saga: off (%s)\n", map[bool]string{true: "--no-saga", false: "its consumers read NATS JetStream only"}[d.flags.noSaga])
	}

	waitCtx, cancelWait := context.WithTimeout(gctx, d.flags.timeout)
	defer cancelWait()
	progressDone := make(chan struct{})
	go d.progress(waitCtx, progressDone)
	d.driver.Run(waitCtx, d.flags.concurrency, 0, d.flags.orders)
	d.printf("  [%5.1fs] %d/%d commands done over HTTP; waiting for the relay and the consumer\n",
		time.Since(d.start).Seconds(), d.driver.Ledger.Len(), d.flags.orders)
	p, convErr := chaos.WaitConverged(waitCtx, d.pool, d.dest, d.where)
	if convErr == nil {
		d.printf("  [%5.1fs] converged: all %d order events published and applied\n", time.Since(d.start).Seconds(), p.Events)
		if d.saga != nil {
			convErr = d.waitSaga(waitCtx)
		}
	}
	if convErr != nil {
		convErr = fmt.Errorf("within --timeout %s: %w", d.flags.timeout, convErr)
	}
	cancelWait()
	<-progressDone

	stop()
	if gerr := g.Wait(); gerr != nil {
		return gerr
	}
	if convErr != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	checkCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	return errors.Join(convErr, d.report(checkCtx))
}

// removeOrKeep drops the run's schema unless --keep (the destination's
// Close removes its stream or topic likewise).
func (d *demoRun) removeOrKeep(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if d.flags.keep {
		d.printf("kept schema %s and the stream or topic (--keep) of %s; a broker of the demo's own went with its data\n",
			d.where.Schema, d.dest.Describe())
		return nil
	}
	if d.pg.cluster != nil {
		return nil // the cluster goes with its directory
	}
	if d.cdc != nil {
		if err := dropCDC(ctx, d.pool, d.where.Schema); err != nil {
			return err
		}
	}
	if _, err := d.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{d.where.Schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", d.where.Schema, err)
	}
	return nil
}

// componentDone turns a component's early exit into an error that stops the
// demo.
func componentDone(name string, ctx context.Context, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if ctx.Err() == nil {
		return fmt.Errorf("%s stopped unexpectedly", name)
	}
	return nil
}

// setUp migrates the schema and builds the components.
func (d *demoRun) setUp(ctx context.Context) error {
	var err error
	d.api, err = ordersapi.New(d.pool, ordersapi.Config{Schema: d.where.Schema, Logger: d.log, Writer: d.flags.writer})
	if err != nil {
		return err
	}
	if err := d.api.Migrate(ctx); err != nil {
		return err
	}
	if d.flags.partitioned {
		if _, err := outboxmigrate.Partition(ctx, d.pool, d.where.Schema, outboxmigrate.PartitionConfig{Interval: time.Minute, Ahead: 5}); err != nil {
			return err
		}
	}
	if err := inventory.Migrate(ctx, d.pool, d.where.Schema, ""); err != nil {
		return err
	}
	// The consumer's destination settings, read from the flags the
	// destination gives its processes in "outbox chaos".
	consOpts, session, err := destinationFlags(d.dest, chaos.RoleConsumer)
	if err != nil {
		return err
	}
	d.consumer, err = inventory.New(d.pool, inventory.Config{
		Settings: inventory.Settings{Schema: d.where.Schema, Stream: consOpts.NATSStream, SubjectPrefix: consOpts.NATSSubjectPrefix,
			AckWait: 5 * time.Second, Logger: d.log},
		SessionTimeout: session, SagaEvents: d.where.Saga,
	})
	return err
}

// setUpRelay opens the relay's publisher, waiting while the destination
// cannot be reached (a webhook consumer still starting), and builds the
// relay.
func (d *demoRun) setUpRelay(ctx context.Context) error {
	relayOpts, _, err := destinationFlags(d.dest, chaos.RoleRelay)
	if err != nil {
		return err
	}
	relayOpts.Source = d.flags.dest.Source
	wctx, cancel := context.WithTimeout(ctx, d.flags.timeout)
	defer cancel()
	pub, closePub, err := destination.OpenWait(wctx, relayOpts, func(ctx context.Context, err error) error {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
			return nil
		}
	})
	if err != nil {
		return err
	}
	d.closePub = closePub
	cfg := outbox.RelayConfig{
		Publisher: pub, Schema: d.where.Schema, ID: "demo-relay-" + d.where.Schema[len("demo_"):],
		PollInterval: 250 * time.Millisecond, Logger: d.log,
	}
	if d.flags.mode == modeCDC {
		return d.setUpCDC(ctx, cfg)
	}
	d.relay, err = outbox.NewRelay(d.pool, cfg)
	return err
}

// setUpCDC builds the CDC relay of --mode cdc: the stream publishes through
// a relay of its own, and the polling relay (cfg) is its safety net. The
// publication and the slot are created before the API takes commands, so
// that the stream sees every event.
func (d *demoRun) setUpCDC(ctx context.Context, cfg outbox.RelayConfig) error {
	net := cfg
	net.ReconcileAfter = reconcileAfterDefault
	var err error
	if d.relay, err = outbox.NewRelay(d.pool, net); err != nil {
		return err
	}
	cfg.ID += "-cdc"
	cfg.DisableNotify = true
	ids, err := outbox.NewRelay(d.pool, cfg)
	if err != nil {
		return err
	}
	ccfg := outboxcdc.Config{DatabaseURL: d.flags.databaseURL, Pool: d.pool, Schema: d.where.Schema, Relay: ids, SafetyNet: d.relay, Logger: d.log}
	if err := outboxcdc.Setup(ctx, ccfg); err != nil {
		return err
	}
	d.cdc, err = outboxcdc.New(ccfg)
	return err
}

// setEnv sets "KEY=value" pairs (the destination's, such as the webhook's
// secret, which the relay's publisher and the consumer read as their
// processes would) in this process and returns a function that restores
// the previous values.
func setEnv(kvs []string) (restore func()) {
	var undo []func()
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		if old, ok := os.LookupEnv(k); ok {
			undo = append(undo, func() { os.Setenv(k, old) })
		} else {
			undo = append(undo, func() { os.Unsetenv(k) })
		}
		os.Setenv(k, v)
	}
	return func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
}

// destinationFlags parses the destination flags dest gives a process of
// role, as that process would.
func destinationFlags(dest chaos.Destination, role string) (destination.Options, time.Duration, error) {
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o destination.Options
	o.Register(fs)
	session := fs.Duration("session-timeout", 0, "")
	if err := fs.Parse(append([]string{"--destination", dest.URL()}, dest.Args(role)...)); err != nil {
		return o, 0, fmt.Errorf("%s flags of %s: %w", role, dest.Name(), err)
	}
	return o, *session, nil
}

// progress prints a line every second until ctx ends.
func (d *demoRun) progress(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p, err := chaos.GetProgress(ctx, d.pool, d.dest, d.where)
		if err != nil {
			continue
		}
		s := d.consumer.Stats()
		d.printf("  [%5.1fs] commands %d/%d | order events written %d, published %d, applied %d | duplicates %d, early %d\n",
			time.Since(d.start).Seconds(), d.driver.Ledger.Len(), d.flags.orders, p.Events, p.Events-p.Unpublished, p.Processed, s.Duplicates, s.Early)
	}
}

// report prints the figures, the lags and the invariant checks (the chaos
// harness's Check, against the driver's ledger).
func (d *demoRun) report(ctx context.Context) error {
	rep, err := chaos.Check(ctx, d.pool, d.dest, d.where, d.driver.Ledger, int(d.consumer.Stats().Anomalies))
	if err != nil {
		return err
	}
	if d.saga != nil {
		if err := d.checkSaga(ctx, rep); err != nil {
			return err
		}
	}
	var p50, p99, pmax, a50, a99 float64
	if err := d.pool.QueryRow(ctx, `SELECT
	coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.published_at - e.occurred_at)), 0),
	coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM e.published_at - e.occurred_at)), 0),
	coalesce(max(extract(epoch FROM e.published_at - e.occurred_at)), 0),
	coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM p.processed_at - e.occurred_at)), 0),
	coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM p.processed_at - e.occurred_at)), 0)
FROM `+pgx.Identifier{d.where.Schema, "outbox_events"}.Sanitize()+` e
LEFT JOIN `+pgx.Identifier{d.where.Schema, "processed_events"}.Sanitize()+` p ON p.consumer_name = $1 AND p.event_id = e.event_id
WHERE e.published_at IS NOT NULL`, inventory.InboxConsumerDefault).Scan(&p50, &p99, &pmax, &a50, &a99); err != nil {
		return fmt.Errorf("lag: %w", err)
	}
	ms := func(s float64) string { return fmt.Sprintf("%.1fms", s*1000) }
	cons, relay := d.consumer.Stats(), d.relay.Stats()
	d.printf("\n")
	rep.WriteFigures(d.out)
	if d.cdc != nil {
		cs := d.cdc.Stats()
		chaos.Line(d.out, "cdc", cs.Published(), fmt.Sprintf("published from the WAL by the CDC path (%d read, %d left to the safety net)", cs.Received(), cs.Left()))
		chaos.Line(d.out, "safety net", relay.Published, fmt.Sprintf("published by the polling safety net (events older than %s)", reconcileAfterDefault))
	} else {
		what := "events"
		if rep.Saga != nil {
			what = "order and saga events"
		}
		chaos.Line(d.out, "relay", relay.Published, fmt.Sprintf("%s marked published after the broker's ack (%d claimed, %d failed)", what, relay.Claimed, relay.Failed))
	}
	chaos.Line(d.out, "applied", cons.Applied, "by the inventory consumer, in the order's transaction")
	chaos.Line(d.out, "duplicates suppressed", cons.Duplicates, fmt.Sprintf("by the inbox: redeliveries after %d dropped acks", failpoint.Fired(inventory.FailpointAfterCommitBeforeAck)))
	chaos.Line(d.out, "early, retried", cons.Early, "delivered before their predecessor: redelivered later")
	chaos.Line(d.out, "commit-to-publish lag", ms(p50), fmt.Sprintf("p50; p99 %s, max %s (occurred_at -> published_at)", ms(p99), ms(pmax)))
	chaos.Line(d.out, "commit-to-apply lag", ms(a50), fmt.Sprintf("p50; p99 %s", ms(a99)))
	rep.WriteSaga(d.out)
	rep.WriteViolations(d.out)
	elapsed := time.Since(d.start).Round(10 * time.Millisecond)
	if n := rep.Total(); n > 0 {
		d.printf("demo FAILED: %d violations (%s)\n", n, elapsed)
		return fmt.Errorf("%d invariant violations: %w", n, rep.Err())
	}
	d.printf("demo passed: all invariants hold (%s)\n", elapsed)
	return nil
}
