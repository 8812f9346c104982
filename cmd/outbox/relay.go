package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

func runRelay(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "relay", "relay [flags]\n\nClaims committed events, publishes them and marks them published after the destination's ack.\nStops on SIGINT/SIGTERM: no new claims, in-flight work finished or released.")
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
	fs.DurationVar(&cfg.RetryBackoffMax, "retry-max", outbox.RetryBackoffMaxDefault, "longest retry delay")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", outbox.MaxAttemptsDefault, "failed attempts after which an event is quarantined")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", outbox.ShutdownTimeoutDefault, "how long to finish in-flight publishes on shutdown")
	fs.BoolVar(&cfg.DisableNotify, "no-notify", false, "do not LISTEN for wake-ups; only poll")
	migrate := fs.Bool("migrate", false, "apply migrations before starting")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	pool, err := common.Connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *migrate {
		if _, err := outboxmigrate.Migrate(ctx, pool, common.Schema); err != nil {
			return err
		}
	}
	if v, err := outboxmigrate.Version(ctx, pool, common.Schema); err != nil {
		return err
	} else if v == 0 {
		return fmt.Errorf("schema %s has no outbox tables: run 'outbox migrate' first (or pass --migrate)", common.Schema)
	}
	pub, closePub, err := destination.Open(ctx, dest)
	if err != nil {
		return err
	}
	defer closePub()
	cfg.Publisher = pub
	cfg.Schema = common.Schema
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	relay, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}
