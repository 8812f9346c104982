package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
)

const replayUsage = `replay [--aggregate-type T] [--aggregate-id ID] [--since TIME] [--until TIME] [--all] [--dry-run] [--json] [flags]

Publishes already-published events again through the destination, with their original event
ids (consumers' inboxes drop what they have applied) and a fresh ce-replayid, in per-aggregate
order. Skipped events are not replayed. --since/--until select on occurred_at and take a time
(2026-01-02T15:04:05Z, 2026-01-02) or a duration ago (2h, 7d). Without any filter, --all is
required. Progress goes to stderr; the summary to stdout. Events deleted by clean-up (older
than the replay horizon) cannot be replayed. --dry-run only counts the events it would replay,
reading and publishing nothing else; with --json it prints {"events": N}, and without --dry-run
{"replay_id", "events", "aggregates", "seconds", ...}.`

func runReplay(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "replay", replayUsage)
	var common cli.Common
	var dest destination.Options
	common.Register(fs)
	dest.Register(fs)
	var cfg outbox.ReplayConfig
	var since, until cli.Time
	fs.StringVar(&cfg.AggregateType, "aggregate-type", "", "only events of this aggregate type")
	fs.StringVar(&cfg.AggregateID, "aggregate-id", "", "only events of this aggregate id")
	fs.Var(&since, "since", "only events that occurred at or after `TIME` (or a duration ago)")
	fs.Var(&until, "until", "only events that occurred before `TIME` (or a duration ago)")
	all := fs.Bool("all", false, "replay every published event kept (required when no filter is given)")
	dryRun := fs.Bool("dry-run", false, "only count the events that would be replayed")
	fs.IntVar(&cfg.BatchSize, "batch-size", outbox.ReplayBatchSizeDefault, "events read per query")
	fs.StringVar(&cfg.By, "by", cli.CurrentUser(), "who replays, recorded in the audit log")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	cfg.Since, cfg.Until = since.T, until.T
	switch {
	case cfg.BatchSize < 1:
		return cli.Usagef(fs, "--batch-size %d must be positive", cfg.BatchSize)
	case cfg.By == "":
		return cli.Usagef(fs, "--by is empty")
	case !cfg.Since.IsZero() && !cfg.Until.IsZero() && !cfg.Until.After(cfg.Since):
		return cli.Usagef(fs, "--until %s is not after --since %s", cfg.Until.Format(time.RFC3339), cfg.Since.Format(time.RFC3339))
	case cfg.AggregateType == "" && cfg.AggregateID == "" && cfg.Since.IsZero() && cfg.Until.IsZero() && !*all:
		return cli.Usagef(fs, "no filter given: pass --aggregate-type, --aggregate-id, --since or --until, or --all to replay everything kept")
	}
	admin, pool, err := openAdmin(ctx, common, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *dryRun {
		n, err := admin.ReplayCount(ctx, cfg)
		if err != nil {
			return err
		}
		if *asJSON {
			return opJSON(os.Stdout, map[string]int64{"events": n})
		}
		fmt.Printf("%d events would be replayed\n", n)
		return nil
	}
	pub, closePub, err := destination.Open(ctx, dest)
	if err != nil {
		return err
	}
	defer closePub()
	var lastReport time.Time
	cfg.Progress = func(p outbox.ReplayProgress) {
		if time.Since(lastReport) < time.Second && p.Replayed < p.Total {
			return
		}
		lastReport = time.Now()
		pct := 100.0
		if p.Total > 0 {
			pct = 100 * float64(p.Replayed) / float64(p.Total)
		}
		rate := float64(p.Replayed) / max(p.Elapsed.Seconds(), 1e-3)
		fmt.Fprintf(os.Stderr, "replay %s: %d/%d events (%.0f%%), %.0f events/s\n", p.ReplayID, p.Replayed, p.Total, pct, rate)
	}
	res, err := admin.Replay(ctx, pub, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return opJSON(os.Stdout, struct {
			outbox.ReplayResult
			Seconds float64 `json:"seconds"`
		}{res, res.Duration.Seconds()})
	}
	fmt.Printf("replay %s: %d events of %d aggregates replayed in %s\n", res.ReplayID, res.Events, res.Aggregates, res.Duration.Round(time.Millisecond))
	return nil
}
