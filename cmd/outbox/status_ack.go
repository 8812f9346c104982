package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/pgoutbox/outbox"
)

// printAckDurability prints, for the live relays, what their destination's
// acknowledgement is worth as each relay's start-up check saw it (recorded
// in its heartbeat row): one line per distinct report, naming its relays.
func printAckDurability(w io.Writer, st outbox.Status) {
	var order []outbox.AckDurability
	relays := map[outbox.DurabilityReport][]string{}
	for _, r := range st.Relays {
		if !r.Alive || r.AckDurability == nil {
			continue
		}
		a := *r.AckDurability
		if _, ok := relays[a.DurabilityReport]; !ok {
			order = append(order, a)
		}
		relays[a.DurabilityReport] = append(relays[a.DurabilityReport], r.ID)
	}
	for _, a := range order {
		fmt.Fprintf(w, "ack durability\t%s\n", ackDurabilityText(a, strings.Join(relays[a.DurabilityReport], ", ")))
	}
}

// ackDurabilityText is one report in a line, naming the relays that made it.
func ackDurabilityText(a outbox.AckDurability, relays string) string {
	switch {
	case a.Reason == outbox.AckCheckPending:
		return fmt.Sprintf("not checked yet (relay %s): %s", relays, strings.TrimPrefix(a.Summary, "not checked yet: "))
	case !a.Checked:
		return fmt.Sprintf("not checked (relay %s): %s", relays, a.Summary)
	case a.Durable:
		return fmt.Sprintf("durable (%s, relay %s): %s", a.Destination, relays, a.Summary)
	default:
		return fmt.Sprintf("NOT DURABLE (%s, relay %s): %s  <- an event marked published can be lost with the broker", a.Destination, relays, a.Summary)
	}
}
