package main

// The CDC slots in `outbox status`: shown only when the schema has some.

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/pgoutbox/outbox/outboxcdc"
)

// statusWithCDC is `outbox status --json`: the outbox status with the CDC
// slots beside its fields.
type statusWithCDC struct {
	statusWithSideEffects
	CDCSlots []outboxcdc.SlotStatus `json:"cdc_slots,omitempty"`
	// Check is --check's outcome.
	Check *checkResult `json:"check,omitempty"`
}

// redecodeNote is the WAL to decode again from which status flags a slot:
// the threshold of the OutboxCDCSlotRedecodeLarge alert.
const redecodeNote = 1 << 30

// printCDCSlots prints the schema's CDC slots, if any, and flags the ones
// to look at.
func printCDCSlots(w io.Writer, slots []outboxcdc.SlotStatus, err error) {
	if err != nil {
		fmt.Fprintf(w, "\ncdc slots: not read: %v\n", err)
		return
	}
	if len(slots) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CDC SLOT\tSTREAMED\tWAL STATUS\tLAG\tRETAINED\tREDECODE\tSAFE WAL\tLAG TIME\t")
	for _, s := range slots {
		streamed, safe, lagTime, note := "no", "unlimited", "-", ""
		if s.Active {
			streamed = "yes"
		} else {
			note = "<- no relay streams it: events wait for the safety net"
		}
		if s.SafeWALBytes != nil {
			safe = opBytes(*s.SafeWALBytes)
		}
		if s.LagSeconds != nil {
			lagTime = opAge(opSeconds(*s.LagSeconds))
		}
		if note == "" && s.RedecodeBytes >= redecodeNote {
			note = "<- a restart or takeover decodes this much again first: an old transaction holds restart_lsn back"
		}
		switch s.WALStatus {
		case "unreserved":
			note = "<- past max_wal_size: lost at a checkpoint unless the relay catches up"
		case "lost":
			note = "<- invalidated: a cdc relay recreates it; the safety net publishes the gap"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Slot, streamed, s.WALStatus, opBytes(s.LagBytes), opBytes(s.RetainedBytes), opBytes(s.RedecodeBytes), safe, lagTime, note)
	}
	tw.Flush()
}
