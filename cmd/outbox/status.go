package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/outboxcdc"
)

const statusUsage = `status [--json] [--check [--max-pending-age D] [--max-quarantined N]] [flags]

Shows whether the outbox is healthy and what is stuck: relays alive (and what
their destination's acknowledgement is worth, as each checked at start), pending
events and the oldest one's age, leases in flight and expired, quarantined
events and what they block, events published in the last minute, all per
aggregate type, table and index sizes, the last operator actions, and the
replication slots of 'outbox relay --mode cdc' (streamed or not, WAL status,
lag, WAL retained and how much more is safe).
With --config relay.yaml (outbox relay --config), one line per source of the
fleet instead: pending, the oldest pending age, quarantined, leases, relays
alive.
With side-effect attempts recorded (package sideeffect; in --schema, or in
--sideeffect-schema), also their counts by state per name, the oldest
unknown outcome's age, blind retries, and the oldest parked attempts.

With --check (for cron, a Kubernetes probe or a monitoring agent, like
'nats server check') it also decides whether the outbox is healthy, with the
thresholds of the shipped alert rules: it exits 1 and says why on stderr
when no relay is alive, when the oldest pending event not parked behind a
quarantined one is older than --max-pending-age (5m), or when more than
--max-quarantined (0) events are
quarantined; else 0. The status itself is printed as without it (with
--json, a "check" object beside it). Exit 2 is a usage error; a database
that cannot be read is exit 1 too, with the error.`

func runStatus(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "status", statusUsage)
	var common cli.Common
	common.Register(fs)
	asJSON := fs.Bool("json", false, "print the status as JSON")
	seSchema := registerSideEffectFlag(fs)
	check := fs.Bool("check", false, "exit 1, saying why on stderr, unless a relay is alive, no pending event is older than --max-pending-age and at most --max-quarantined events are quarantined")
	var c statusCheck
	fs.DurationVar(&c.maxPendingAge, "max-pending-age", 5*time.Minute, "with --check: the oldest pending event's age that fails the check (the OutboxOldestPendingTooOld alert's)")
	fs.Int64Var(&c.maxQuarantined, "max-quarantined", 0, "with --check: the most quarantined events that pass it")
	configFile := fs.String("config", "", "show every source of a fleet's configuration `FILE` (outbox relay --config): one line each, read from each database (only --json applies beside it)")
	err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if *configFile != "" {
		return runFleetStatus(ctx, fs, *configFile, *asJSON, os.Stdout)
	}
	thresholds := false
	fs.Visit(func(f *flag.Flag) {
		thresholds = thresholds || f.Name == "max-pending-age" || f.Name == "max-quarantined"
	})
	if !*check && thresholds {
		return cli.Usagef(fs, "--max-pending-age and --max-quarantined go with --check")
	}
	if c.maxPendingAge <= 0 || c.maxQuarantined < 0 {
		return cli.Usagef(fs, "--max-pending-age must be positive and --max-quarantined not negative")
	}
	admin, pool, err := openAdmin(ctx, common, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := admin.Status(ctx)
	if err != nil {
		return err
	}
	se, err := sideEffectStatus(ctx, pool, *seSchema, common.Schema)
	if err != nil {
		return err
	}
	slots, slotsErr := outboxcdc.Slots(ctx, pool, common.Schema)
	var res *checkResult
	if *check {
		r := c.run(st)
		res = &r
	}
	if *asJSON {
		if slotsErr != nil {
			return slotsErr
		}
		if err := opJSON(os.Stdout, statusWithCDC{statusWithSideEffects: statusWithSideEffects{Status: st, SideEffects: se}, CDCSlots: slots, Check: res}); err != nil {
			return err
		}
	} else {
		printOutboxStatus(os.Stdout, st)
		printSideEffects(os.Stdout, se)
		printCDCSlots(os.Stdout, slots, slotsErr)
	}
	if res == nil {
		return nil
	}
	return res.err()
}

func printOutboxStatus(w io.Writer, st outbox.Status) {
	fmt.Fprintf(w, "schema %s (migration %d) at %s\n\n", st.Schema, st.MigrationVersion, st.At.Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var alive []string
	for _, r := range st.Relays {
		if r.Alive {
			alive = append(alive, fmt.Sprintf("%s (heartbeat %s ago)", r.ID, opAge(st.At.Sub(r.HeartbeatAt))))
		}
	}
	relays := fmt.Sprintf("%d alive", st.RelaysAlive)
	if len(alive) > 0 {
		relays += ": " + strings.Join(alive, ", ")
	} else {
		relays += "  <- nothing publishes: start 'outbox relay'"
	}
	fmt.Fprintf(tw, "relays\t%s\n", relays)
	for _, r := range st.Relays {
		if r.Untrusted != "" {
			fmt.Fprintf(tw, "\trelay %s: %s\n", r.ID, r.Untrusted)
		}
	}
	printAckDurability(tw, st)
	fmt.Fprintf(tw, "pending\t%d (oldest %s, %d retrying after failures)\n", st.Pending, opAge(opSeconds(st.OldestPendingAgeSeconds)), st.Retrying)
	expired := ""
	if st.ExpiredLeases > 0 {
		expired = "  <- a relay died or stalled; another takes them over"
	}
	fmt.Fprintf(tw, "leases\t%d in flight, %d expired%s\n", st.Leased, st.ExpiredLeases, expired)
	quarantined := fmt.Sprintf("%d", st.Quarantined)
	if st.Quarantined > 0 {
		quarantined += fmt.Sprintf(", blocking %d later events  <- see 'outbox quarantine list'", st.BlockedByQuarantine)
	}
	fmt.Fprintf(tw, "quarantined\t%s\n", quarantined)
	fmt.Fprintf(tw, "published\t%d in the last minute\n", st.PublishedLastMinute)
	tw.Flush()

	if len(st.AggregateTypes) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(tw, "AGGREGATE TYPE\tPENDING\tOLDEST\tRETRYING\tIN FLIGHT\tEXPIRED\tQUARANTINED\tPUBLISHED/MIN")
		for _, t := range st.AggregateTypes {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n", t.AggregateType, t.Pending, opAge(opSeconds(t.OldestPendingAgeSeconds)),
				t.Retrying, t.Leased, t.ExpiredLeases, t.Quarantined, t.PublishedLastMinute)
		}
		tw.Flush()
	}

	fmt.Fprintln(w)
	fmt.Fprintln(tw, "TABLE\tROWS (EST.)\tHEAP\tINDEXES\tTOTAL")
	for _, t := range st.Tables {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Table, opCount(t.Rows), opBytes(t.HeapBytes), opBytes(t.IndexBytes), opBytes(t.TotalBytes))
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(tw, "INDEX\tTABLE\tSIZE")
	for _, i := range st.Indexes {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", i.Index, i.Table, opBytes(i.Bytes))
	}
	tw.Flush()

	if ps := st.Partitions; ps != nil {
		fmt.Fprintln(w)
		ready := fmt.Sprintf("partitions ready until %s (%s ahead)", ps.ReadyUntil.Format(time.RFC3339), ps.ReadyUntil.Sub(st.At).Round(time.Second))
		if ps.ReadyUntil.Sub(st.At).Seconds() < 2*ps.IntervalSeconds {
			ready += "  <- less than two partitions ahead: is a relay (or `outbox cleanup`) running the upkeep as the tables' owner?"
		}
		fmt.Fprintln(w, ready)
		fmt.Fprintln(tw, "PARTITION	FROM	ROWS (EST.)	TOTAL	LAST PUBLISHED	STAYS BECAUSE")
		for _, p := range ps.Partitions {
			last, why := "-", p.Held
			if p.LastPublished != nil {
				last = p.LastPublished.Format(time.RFC3339)
			}
			switch {
			case !p.Closed && p.From.After(st.At):
				why = "ahead"
			case !p.Closed:
				why = "current"
			case why == "":
				why = "settled: goes once LAST PUBLISHED is past the replay horizon"
			}
			if p.DetachPending {
				why = "detach interrupted: the next upkeep finishes it; " + why
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.From.Format(time.RFC3339), opCount(p.Rows), opBytes(p.TotalBytes), last, why)
		}
		tw.Flush()
	}

	if len(st.RecentOperations) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(tw, "RECENT OPERATOR ACTIONS\tBY\tEVENT\tREASON")
		for _, o := range st.RecentOperations {
			event := "-"
			if o.EventID != nil {
				event = o.EventID.String()
			}
			reason := o.Reason
			if o.Action == "replay" {
				reason = fmt.Sprintf("%v events", o.Detail["replayed"])
			}
			fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\n", o.At.Format(time.RFC3339), o.Action, o.Actor, event, opOneLine(reason, 60))
		}
		tw.Flush()
	}
}
