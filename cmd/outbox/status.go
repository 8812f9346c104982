package main

import (
	"context"
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

const statusUsage = `status [--json] [flags]

Shows whether the outbox is healthy and what is stuck: relays alive (and what
their destination's acknowledgement is worth, as each checked at start), pending
events and the oldest one's age, leases in flight and expired, quarantined
events and what they block, events published in the last minute, all per
aggregate type, table and index sizes, the last operator actions, and the
replication slots of 'outbox relay --mode cdc' (streamed or not, WAL status,
lag, WAL retained and how much more is safe).
With side-effect attempts recorded (package sideeffect; in --schema, or in
--sideeffect-schema), also their counts by state per name, the oldest
unknown outcome's age, blind retries, and the oldest parked attempts.`

func runStatus(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "status", statusUsage)
	var common cli.Common
	common.Register(fs)
	asJSON := fs.Bool("json", false, "print the status as JSON")
	seSchema := registerSideEffectFlag(fs)
	err := cli.Parse(fs, args)
	if err != nil {
		return err
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
	if *asJSON {
		if slotsErr != nil {
			return slotsErr
		}
		return opJSON(os.Stdout, statusWithCDC{statusWithSideEffects: statusWithSideEffects{Status: st, SideEffects: se}, CDCSlots: slots})
	}
	printOutboxStatus(os.Stdout, st)
	printSideEffects(os.Stdout, se)
	printCDCSlots(os.Stdout, slots, slotsErr)
	return nil
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
