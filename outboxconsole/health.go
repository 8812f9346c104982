package outboxconsole

import (
	"sort"
	"time"

	"github.com/pgoutbox/outbox"
)

// Per-relay and per-destination health, from what each relay records in
// its heartbeat row (outbox.RelayInfo.Health, migration 015: its /readyz
// reason, since when it is not ready, its last error; AckDurability: its
// destination's kind).

// destinationHealth is the health of the relays of one kind of destination.
type destinationHealth struct {
	// Destination is the kind the relays recorded ("nats", "kafka",
	// "amqp"), or "" when they recorded none.
	Destination string
	// Relays counts the relays alive; Ready those of them ready; Silent
	// those that recorded no health (older, or a schema before 015).
	Relays, Ready, Silent int
	// NotReadySince is the earliest spell of a relay still not ready;
	// Reason its reason.
	NotReadySince *time.Time
	Reason        string
	// LastError is the most recent error a relay recorded, at LastErrorAt.
	LastError   string
	LastErrorAt *time.Time
	// Durable: every relay that checked found the acknowledgement durable;
	// Summary the last check's line.
	Checked, Durable bool
	Summary          string
}

// State is "ready" when every relay that recorded its health is ready,
// "not ready" when one is not, "unknown" when none recorded it.
func (d destinationHealth) State() string {
	switch {
	case d.Silent == d.Relays:
		return "unknown"
	case d.Ready+d.Silent == d.Relays:
		return "ready"
	}
	return "not ready"
}

// destinationsOf groups the relays alive by destination.
func destinationsOf(relays []outbox.RelayInfo) []destinationHealth {
	by := map[string]*destinationHealth{}
	var order []string
	for _, r := range relays {
		if !r.Alive {
			continue
		}
		kind := ""
		if r.AckDurability != nil {
			kind = r.AckDurability.Destination
		}
		d := by[kind]
		if d == nil {
			d = &destinationHealth{Destination: kind, Durable: true}
			by[kind] = d
			order = append(order, kind)
		}
		d.Relays++
		if a := r.AckDurability; a != nil && a.Checked {
			d.Checked = true
			d.Durable = d.Durable && a.Durable
			d.Summary = a.Summary
		}
		h := r.Health
		if h == nil {
			d.Silent++
			continue
		}
		if h.Ready {
			d.Ready++
		} else if h.NotReadySince != nil && (d.NotReadySince == nil || h.NotReadySince.Before(*d.NotReadySince)) {
			d.NotReadySince, d.Reason = h.NotReadySince, h.Reason
		} else if d.Reason == "" {
			d.Reason = h.Reason
		}
		if h.LastErrorAt != nil && (d.LastErrorAt == nil || h.LastErrorAt.After(*d.LastErrorAt)) {
			d.LastErrorAt, d.LastError = h.LastErrorAt, h.LastError
		}
	}
	sort.Strings(order)
	out := make([]destinationHealth, 0, len(order))
	for _, k := range order {
		d := by[k]
		if !d.Checked {
			d.Durable = false
		}
		out = append(out, *d)
	}
	return out
}
