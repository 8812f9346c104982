package chaos

import (
	"fmt"
	"io"
)

// Line writes one figure of a report: its name, its value and a note.
func Line(w io.Writer, name string, v any, note string) {
	fmt.Fprintf(w, "%-26s %8v   %s\n", name, v, note)
}

// WriteFigures writes what the client sent and what became of it, one
// figure a line: the part of a report "outbox chaos" and "outbox demo"
// share.
func (r *Report) WriteFigures(w io.Writer) {
	Line(w, "commands", r.Commands, fmt.Sprintf("%d HTTP requests", r.Requests))
	Line(w, "commits", r.Commits, fmt.Sprintf("%d orders, %d cancellations", r.CreatesCommitted, r.CancelsCommitted))
	Line(w, "rollbacks", r.Rollbacks, "unknown SKU (422), or unanswered and found not committed")
	Line(w, "refused", r.Refused, "second cancellations (409)")
	Line(w, "unanswered", r.Ambiguous, fmt.Sprintf("500 or connection lost; %d settled by retry, %d from the database", r.Ambiguous-r.ResolvedByDB, r.ResolvedByDB))
	Line(w, "idempotent replays", r.Replays, "same Idempotency-Key: same order, nothing written")
	Line(w, "key reuses refused", r.KeyReusesRefused, "same Idempotency-Key, another body: 422, nothing written")
	Line(w, "not sent", r.NotSent, "the API was down until the run ended")
	where := "at the destination"
	if r.SagaEvents > 0 || r.Saga != nil {
		// Two kinds of events share the outbox: each its own count.
		Line(w, "order events", r.Events, fmt.Sprintf("written by the order API, one per committed command; %d published", r.Published))
		Line(w, "saga events", r.SagaEvents, fmt.Sprintf("written by inventory and payments (stock and payment steps); %d published", r.SagaPublished))
		where = "the order events' messages at the destination"
	} else {
		Line(w, "events", r.Events, fmt.Sprintf("%d published", r.Published))
	}
	Line(w, "stream messages", r.StreamMessages, fmt.Sprintf("%s; %d duplicates published (republished after a crash or a stale lease)", where, r.DuplicatesPublished))
	if r.Deliveries >= 0 {
		Line(w, "deliveries", r.Deliveries, "to the inventory consumers ("+r.Destination+")")
		Line(w, "duplicates delivered", r.DuplicatesDelivered, "deliveries beyond the first of each event")
	} else {
		Line(w, "deliveries", "-", r.Destination+" does not count deliveries; the inbox counts the duplicates")
	}
}

// WriteViolations writes, per invariant, the number of violations and the
// first of them.
func (r *Report) WriteViolations(w io.Writer) {
	for _, inv := range r.invariants() {
		desc := Descriptions[inv]
		if inv == "I7" && r.Saga != nil && r.Saga.RelaxedI7 {
			desc = i7Relaxed
		}
		Line(w, "violations "+inv, r.Count(inv), desc)
		for _, v := range r.Violations[inv] {
			fmt.Fprintf(w, "    - %s\n", v)
		}
	}
}
