package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/internal/otelexport"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

func runRelay(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "relay", "relay [flags]\n\nClaims committed events, publishes them and marks them published after the destination's ack.\nWaits for the database and the destination at start (retrying with backoff; /readyz answers 503 meanwhile).\nStops on SIGINT/SIGTERM: no new claims, in-flight work finished or released.\nOTEL_TRACES_EXPORTER=console prints a span per event published as a JSON line on stdout (see docs/operations.md, Tracing).\n\nModes (--mode): polling claims events from the table (the default); cdc reads committed\ninserts from a logical replication slot (wal_level=logical) and publishes them at once, with a\npolling safety net for events pending longer than --reconcile-after; reconcile runs only\nthat safety net.\n\nMany outboxes (--config relay.yaml): one process serves every source the file lists, sharing one\npool and one LISTEN connection per database; /readyz names the sources that are down.")
	var common cli.Common
	var dest destination.Options
	common.Register(fs)
	dest.Register(fs)
	var cfg outbox.RelayConfig
	fs.StringVar(&cfg.ID, "id", os.Getenv("OUTBOX_RELAY_ID"), "relay name recorded in claimed_by (env OUTBOX_RELAY_ID; default host-pid-random)")
	fs.IntVar(&cfg.BatchSize, "batch-size", outbox.BatchSizeDefault, "most events claimed per round trip")
	fs.DurationVar(&cfg.LeaseDuration, "lease", outbox.LeaseDurationDefault, "how long a claim is this relay's before another relay may take it over")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", outbox.PollIntervalDefault, "wait between looks for events when idle and not notified")
	fs.DurationVar(&cfg.RetryBackoffMin, "retry-min", outbox.RetryBackoffMinDefault, "first retry delay after a failed publish")
	fs.DurationVar(&cfg.RetryBackoffMax, "retry-max", outbox.RetryBackoffMaxDefault, "longest retry delay (also of the events of a route the destination refuses)")
	fs.DurationVar(&cfg.OutageProbeMax, "outage-probe-max", outbox.OutageProbeMaxDefault, "longest wait between two looks at an unavailable destination, or probes of a refused route")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", outbox.MaxAttemptsDefault, "failed attempts after which an event is quarantined")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", outbox.ShutdownTimeoutDefault, "how long to finish in-flight publishes on shutdown")
	fs.BoolVar(&cfg.DisableNotify, "no-notify", false, "do not LISTEN for wake-ups; only poll")
	fs.BoolVar(&cfg.DisablePipelining, "no-pipelining", false, "publish one event per aggregate per broker round trip even to a destination that declares ordered pipelining (Kafka)")
	fs.BoolVar(&cfg.DisableClaimAhead, "no-claim-ahead", false, "do not claim the next batch while one is being published")
	fs.DurationVar(&cfg.CatchUpInterval, "catch-up-interval", outbox.CatchUpIntervalDefault, "shortest time between two claims while the relay keeps up with the writers (negative: none)")
	migrate := fs.Bool("migrate", false, "apply migrations before starting")
	syncCommit := fs.Bool("sync-commit", false, "make the relay's own writes (claims, marks) wait for the WAL flush; off by default: losing them in a database crash only republishes events")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", outbox.HeartbeatIntervalDefault, "how often the relay records itself alive (status, outbox_relays_alive)")
	var ops relayOpsFlags
	ops.register(fs)
	var mode relayModeFlags
	mode.register(fs)
	fs.DurationVar(&cfg.CleanupInterval, "cleanup-interval", outbox.CleanupIntervalDefault, "pause between periodic clean-ups")
	fs.IntVar(&cfg.PartitionsAhead, "partitions-ahead", outbox.PartitionsAheadDefault, "on a partitioned outbox (migrate --partitioned): partitions kept ready ahead of the current one; settled ones past --cleanup-older-than are dropped (needs the tables' owner)")
	fs.IntVar(&cfg.Cleanup.BatchSize, "cleanup-batch-size", outbox.CleanupBatchSizeDefault, "rows deleted per clean-up transaction")
	fs.DurationVar(&cfg.RescanInterval, "rescan-interval", outbox.RescanIntervalDefault, "how often a claim scans every pending event instead of only what is new since the last claim (finds leases of relays that died; negative: every claim scans)")
	fs.DurationVar(&cfg.LaneSweepInterval, "lane-sweep-interval", outbox.LaneSweepIntervalDefault, "how often the relay parks events waiting behind a quarantined event that were written unparked, and unparks lanes released by hand")
	fs.DurationVar(&cfg.VacuumInterval, "vacuum-interval", outbox.VacuumIntervalDefault, "where autovacuum is off for outbox_events, how often the relay runs VACUUM (ANALYZE) on the outbox tables itself (negative: never)")
	configFile := fs.String("config", cli.Env("OUTBOX_RELAY_CONFIG", ""), "serve many outboxes from one process: a YAML `FILE` listing databases, sources (a schema, or every schema matching a pattern, discovered as they appear) and destinations, with routes by aggregate type (env OUTBOX_RELAY_CONFIG; see docs/operations.md, One relay for many outboxes). Beside it only --metrics-addr, --sync-commit and --shutdown-timeout apply")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *configFile != "" {
		if err := checkFleetFlags(fs); err != nil {
			return err
		}
		return runFleet(ctx, *configFile, ops.metricsAddr, *syncCommit, cfg.ShutdownTimeout, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	}
	if err := mode.check(fs); err != nil {
		return err
	}
	mode.apply(&cfg)
	if err := ops.horizons.check("cleanup-", false); err != nil {
		return cli.Usagef(fs, "%v", err)
	}
	cfg.Cleanup.OlderThan, cfg.Cleanup.InboxOlderThan = ops.horizons.olderThan.D, ops.horizons.inboxOlderThan.D
	common.RuntimeParams = outbox.RelaySessionParams(*syncCommit)
	// The relay's sessions say who they are in pg_stat_activity (the
	// database URL's application_name, when it has one, wins): an operator
	// looking at what holds a lock or an old snapshot finds "outbox relay".
	common.RuntimeParams["application_name"] = "outbox relay"
	if cfg.ID != "" {
		common.RuntimeParams["application_name"] = "outbox relay " + cfg.ID
	}
	cfg.Schema = common.Schema
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	tp, stopTraces, err := otelexport.FromEnv(ctx, "outbox-relay", os.Stdout)
	if err != nil {
		return err
	}
	defer otelexport.Stop(ctx, stopTraces)
	cfg.TracerProvider = tp
	pool, err := common.NewPool()
	if err != nil {
		return err
	}
	defer pool.Close()
	metrics, err := ops.metrics(pool, common.Schema, cfg.Logger)
	if err != nil {
		return err
	}
	if metrics != nil {
		cfg.Observer = metrics
	}
	// Refuse bad flags now, not after waiting for the database and broker.
	check := cfg
	check.Publisher = outbox.PublisherFunc(nil)
	if _, err := outbox.NewRelay(pool, check); err != nil {
		return err
	}
	// /healthz and /readyz answer while the relay waits for the database
	// and the destination; /readyz says which.
	readiness := newRelayReadiness()
	var extra []prometheus.Collector
	if metrics != nil && mode.mode != modePolling {
		mode.metrics = newCDCCollector(pool, common.Schema, cfg.Logger)
		extra = append(extra, mode.metrics)
	}
	stopMetrics, err := ops.serve(metrics, mode.ready(readiness.ready), cfg.Logger, extra...)
	if err != nil {
		return err
	}
	defer stopMetrics()

	db := &startWaiter{what: "database", log: cfg.Logger, ready: readiness}
	err = db.until(ctx, func(ctx context.Context) error {
		if err := common.Ping(ctx, pool); err != nil {
			return err
		}
		if *migrate {
			if _, err := outboxmigrate.Migrate(ctx, pool, common.Schema); err != nil {
				return err
			}
		}
		if err := requireLatestSchema(ctx, pool, common.Schema); err != nil {
			if databaseUnreachable(err) {
				return err
			}
			return fmt.Errorf("%w (or pass --migrate)", err)
		}
		return nil
	}, databaseUnreachable)
	if err != nil {
		return stoppedWaiting(ctx, err, cfg.Logger)
	}
	dst := &startWaiter{what: "destination", log: cfg.Logger, ready: readiness}
	readiness.wait(errors.New("waiting for the destination"))
	pub, closePub, err := destination.OpenWait(ctx, dest, dst.retry)
	if err != nil {
		return stoppedWaiting(ctx, err, cfg.Logger)
	}
	defer closePub()
	cfg.Publisher = brokenBuild(pool, common.Schema, pub) // pub itself, except in the chaos test's broken build
	relay, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		return err
	}
	readiness.started(relay)
	if mode.mode == modeCDC {
		return mode.runCDC(ctx, pool, common.DatabaseURL, cfg, relay)
	}
	return relay.Run(ctx)
}

// stoppedWaiting turns a start-up cut short by SIGINT/SIGTERM into a clean
// exit; any other error is returned.
func stoppedWaiting(ctx context.Context, err error, log *slog.Logger) error {
	if ctx.Err() != nil {
		log.Info("relay stopped before it started", slog.Any("reason", context.Cause(ctx)))
		return nil
	}
	return err
}
