package outboxfleet

import (
	"github.com/prometheus/client_golang/prometheus"
)

// fleetMetrics are the fleet's own series, beside each source's.
type fleetMetrics struct {
	started, retired prometheus.Counter
}

func newFleetMetrics(reg prometheus.Registerer) (*fleetMetrics, error) {
	m := &fleetMetrics{
		started: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_fleet_sources_started_total",
			Help: "Sources whose relay the fleet started (found at start, discovered, or restarted after an error)."}),
		retired: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_fleet_sources_retired_total",
			Help: "Sources the fleet retired because their schema was dropped."}),
	}
	for _, c := range []prometheus.Collector{m.started, m.retired} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
