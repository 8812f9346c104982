package outboxprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox/sideeffect"
)

// The side-effect series (package sideeffect), prefixed sideeffect_ like the
// inbox's are inbox_: they belong to the consumer, not to the relay.
//
// Counted by the process (Metrics as sideeffect.Config.Observer), by name:
//
//	sideeffect_calls_total{name,outcome}            calls to the provider: succeeded, failed, unknown, not_sent
//	sideeffect_blind_retries_total{name}            calls made again without knowing whether the earlier one took effect (mode neither)
//	sideeffect_reconciliations_total{name,result}   lookups of unknown attempts: succeeded, failed, not_found, error
//	sideeffect_replays_total{name}                  Do calls answered from the record, without a call
//	sideeffect_parked_total{name}                   attempts parked for an operator
//	sideeffect_call_seconds{name}                   histogram: the calls' duration
//
// Sampled from the database (Config.SideEffects), for every name:
//
//	sideeffect_attempts{name,state}                 open attempts: started (under a live claim), unknown, parked
//	sideeffect_oldest_unknown_age_seconds{name}     how long the oldest unknown attempt has been so (0 when none)
type sideEffectMetrics struct {
	calls, blind, reconciliations, replays, parked *prometheus.CounterVec
	seconds                                        *prometheus.HistogramVec
	attemptsDesc, oldestDesc                       *prometheus.Desc
}

var _ sideeffect.Observer = (*Metrics)(nil)

func newSideEffectMetrics(labels prometheus.Labels, latency []float64) *sideEffectMetrics {
	vec := func(name, help string, l ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, l)
	}
	return &sideEffectMetrics{
		calls: vec("sideeffect_calls_total", "Calls to the external provider, by outcome recorded (succeeded, failed, unknown, not_sent).", "name", "outcome"),
		blind: vec("sideeffect_blind_retries_total",
			"Calls made again without knowing whether the earlier one took effect (provider mode neither): each a possible duplicate.", "name"),
		reconciliations: vec("sideeffect_reconciliations_total",
			"Lookups of attempts whose outcome was unknown, by result (succeeded, failed, not_found, error).", "name", "result"),
		replays: vec("sideeffect_replays_total", "Do calls answered from the recorded outcome, without calling the provider.", "name"),
		parked:  vec("sideeffect_parked_total", "Attempts parked for an operator (past the bound, or mode neither).", "name"),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sideeffect_call_seconds", ConstLabels: labels,
			Help: "Duration of the calls to the external provider.", Buckets: latency}, []string{"name"}),
		attemptsDesc: prometheus.NewDesc("sideeffect_attempts",
			"Open side-effect attempts by state: started (under a live claim), unknown (a started one past its lease included), parked (sampled from the database).",
			[]string{"name", "state"}, labels),
		oldestDesc: prometheus.NewDesc("sideeffect_oldest_unknown_age_seconds",
			"How long the oldest unknown attempt of the name has been unknown, 0 when none (sampled from the database).", []string{"name"}, labels),
	}
}

func (s *sideEffectMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.calls, s.blind, s.reconciliations, s.replays, s.parked, s.seconds}
}

func (s *sideEffectMetrics) collectGauges(ch chan<- prometheus.Metric, gauges []sideeffect.Gauges) {
	for _, g := range gauges {
		for state, v := range map[sideeffect.State]int64{sideeffect.Started: g.Started, sideeffect.Unknown: g.Unknown, sideeffect.Parked: g.Parked} {
			ch <- prometheus.MustNewConstMetric(s.attemptsDesc, prometheus.GaugeValue, float64(v), g.Name, string(state))
		}
		ch <- prometheus.MustNewConstMetric(s.oldestDesc, prometheus.GaugeValue, g.OldestUnknownAgeSeconds, g.Name)
	}
}

// ObserveSideEffect implements sideeffect.Observer. A name's counters exist
// from its first observation on, so that their rates are 0 rather than
// missing.
func (m *Metrics) ObserveSideEffect(o sideeffect.Observation) {
	s := m.se
	for _, out := range []string{"succeeded", "failed", "unknown", "not_sent"} {
		s.calls.WithLabelValues(o.Name, out)
	}
	for _, r := range []string{sideeffect.LookupSucceeded, sideeffect.LookupFailed, sideeffect.LookupNotFound, sideeffect.LookupError} {
		s.reconciliations.WithLabelValues(o.Name, r)
	}
	blind, replays, parked := s.blind.WithLabelValues(o.Name), s.replays.WithLabelValues(o.Name), s.parked.WithLabelValues(o.Name)
	switch o.Op {
	case sideeffect.OpCall:
		s.seconds.WithLabelValues(o.Name).Observe(o.Duration.Seconds())
		switch o.State {
		case sideeffect.Succeeded, sideeffect.Failed, sideeffect.Unknown:
			s.calls.WithLabelValues(o.Name, string(o.State)).Inc()
		case "":
			s.calls.WithLabelValues(o.Name, "not_sent").Inc()
		}
		if o.Blind && o.State != "" {
			blind.Inc()
		}
	case sideeffect.OpLookup:
		s.reconciliations.WithLabelValues(o.Name, o.LookupResult).Inc()
	case sideeffect.OpReplay:
		replays.Inc()
	case sideeffect.OpPark:
		parked.Inc()
	}
}
