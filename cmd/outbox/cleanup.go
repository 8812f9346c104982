package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
)

const cleanupUsage = `cleanup --older-than DUR [--inbox-older-than DUR] [--batch-size 1000] [flags]

Deletes settled events (published or skipped) whose published_at is older than --older-than,
the replay horizon, in batches of --batch-size rows per transaction, oldest first. Unpublished
and quarantined events are never deleted, and a skipped event stays until the next event of its
aggregate is settled. With --inbox-older-than it also deletes the inbox's processed_events rows
older than that, which must not be shorter than --older-than (an event that can be replayed must
still be known to the inboxes). Durations take s, m, h and d (7d). Interrupted or crashed, it
loses at most the batch in progress: run it again. 'outbox relay --cleanup-older-than' runs the
same clean-up periodically.

On a partitioned outbox (outbox migrate --partitioned) it deletes no event: it creates the
partitions due ahead and detaches and drops each partition whose events are all settled and
published longer ago than --older-than, and says which partitions past the horizon stay and why
(an unpublished or quarantined event, a skip marker a later event needs); it also finishes a
detach an earlier round left unfinished (dropped, or attached again when its events are not all
settled). That needs the tables' owner: run it as that role (from cron, say) when the relay's role
is not. As another role it says so on stderr, skips the partitions and cleans up the inbox.`

// cleanupFlags are the horizon flags shared with `outbox relay`.
type cleanupFlags struct {
	olderThan, inboxOlderThan cli.Duration
}

// check validates the horizons, naming the flags.
func (c cleanupFlags) check(prefix string, required bool) error {
	switch {
	case required && c.olderThan.D == 0:
		return fmt.Errorf("--%solder-than is required and must be positive (the replay horizon, e.g. 7d)", prefix)
	case c.inboxOlderThan.D > 0 && c.olderThan.D == 0:
		return fmt.Errorf("--%sinbox-older-than needs --%solder-than (the replay horizon)", prefix, prefix)
	case c.inboxOlderThan.D > 0 && c.inboxOlderThan.D < c.olderThan.D:
		return fmt.Errorf("refusing --%sinbox-older-than %s: it is shorter than the replay horizon --%solder-than %s, so inboxes would forget events that can still be replayed",
			prefix, &c.inboxOlderThan, prefix, &c.olderThan)
	}
	return nil
}

func runCleanup(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "cleanup", cleanupUsage)
	var common cli.Common
	common.Register(fs)
	var horizons cleanupFlags
	fs.Var(&horizons.olderThan, "older-than", "delete settled events published longer ago than `DURATION` (required; e.g. 7d)")
	fs.Var(&horizons.inboxOlderThan, "inbox-older-than", "also delete inbox rows processed longer ago than `DURATION` (not shorter than --older-than)")
	batch := fs.Int("batch-size", outbox.CleanupBatchSizeDefault, "rows deleted per transaction")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	quiet := fs.Bool("quiet", false, "no progress lines")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if err := horizons.check("", true); err != nil {
		return cli.Usagef(fs, "%v", err)
	}
	if *batch < 1 {
		return cli.Usagef(fs, "--batch-size %d must be positive", *batch)
	}
	admin, pool, err := openAdmin(ctx, common, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := outbox.CleanupConfig{OlderThan: horizons.olderThan.D, InboxOlderThan: horizons.inboxOlderThan.D, BatchSize: *batch}
	if !*quiet {
		var last time.Time
		cfg.Progress = func(p outbox.CleanupProgress) {
			if p.Deleted == *batch && time.Since(last) < time.Second {
				return
			}
			last = time.Now()
			fmt.Fprintf(os.Stderr, "cleanup %s: %d rows deleted so far\n", p.Table, p.Total)
		}
	}
	res, err := admin.Cleanup(ctx, cfg)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return fmt.Errorf("interrupted after deleting %d events and %d inbox rows (run it again to go on)", res.Events, res.InboxRows)
		}
		return err
	}
	if *asJSON {
		return opJSON(os.Stdout, map[string]any{"events_deleted": res.Events, "inbox_rows_deleted": res.InboxRows,
			"batches": res.Batches, "seconds": res.Duration.Seconds(), "partitions_dropped": res.PartitionsDropped,
			"partitions_created": res.PartitionsCreated, "partitions_held": res.PartitionsHeld, "partition_upkeep_skipped": res.PartitionUpkeepSkipped})
	}
	if res.PartitionUpkeepSkipped {
		fmt.Fprintf(os.Stderr, "outbox cleanup: schema %s: %s\n", common.Schema, outbox.PartitionUpkeepSkippedNote)
	}
	if len(res.PartitionsDropped)+len(res.PartitionsCreated)+len(res.PartitionsHeld) > 0 {
		fmt.Printf("partitioned outbox: dropped %d partitions past %s, created %d ahead\n", len(res.PartitionsDropped), &horizons.olderThan, len(res.PartitionsCreated))
		for _, h := range res.PartitionsHeld {
			fmt.Printf("  %s stays: %s\n", h.Name, h.Held)
		}
	}
	inbox := ""
	if cfg.InboxOlderThan > 0 {
		inbox = fmt.Sprintf(" and %d inbox rows older than %s", res.InboxRows, &horizons.inboxOlderThan)
	}
	fmt.Printf("deleted %d settled events older than %s%s in %d batches (%s)\n", res.Events, &horizons.olderThan, inbox,
		res.Batches, res.Duration.Round(time.Millisecond))
	return nil
}
