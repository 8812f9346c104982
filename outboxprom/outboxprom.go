// Package outboxprom exports the outbox's metrics to Prometheus.
//
// A [Metrics] is a prometheus.Collector and an observer of the relay
// (outbox.RelayConfig.Observer), of clean-ups (outbox.AdminConfig.Observer)
// and of an inbox (inbox.Config.Observer). The root package and the inbox
// depend on no metrics library: they report through small observer
// interfaces that Metrics implements.
//
// # Series
//
// Every series has the label schema. Counted by the process as it works:
//
//	outbox_claimed_events_total              events claimed
//	outbox_published_total                   events acknowledged by the destination and marked published
//	outbox_failures_total{reason}            failed publish attempts: retryable, permanent, unavailable
//	outbox_quarantined_total                 events this process quarantined
//	outbox_expired_claims_total              events taken over from another relay's expired lease
//	outbox_lease_conflicts_total             write-backs refused because another relay had taken the events over
//	outbox_publish_attempts                  histogram: the attempt on which an event was published
//	outbox_broker_ack_seconds                histogram: destination acknowledgement latency per event
//	outbox_commit_to_publish_seconds         histogram: occurred_at to acknowledgement
//	outbox_db_statement_seconds{statement}   histogram: the relay's statements (claim, full_scan, mark_published, ...)
//	outbox_cleanup_deleted_total{table}      rows deleted by clean-up (outbox_events, processed_events)
//	outbox_relay_up                          1 while the relay's last claim succeeded, 0 after a failed one
//	outbox_destination_unavailable           1 while the relay finds the destination unavailable as a whole, else 0
//	outbox_destination_refused_routes        routes the destination refuses (a missing binding or topic) whose events the relay holds
//	outbox_destination_ack_durable{destination,reason}
//	                                         1 when the destination's acknowledgement is durable, 0 when not,
//	                                         as the relay's start-up check saw it (outbox.DurabilityChecker);
//	                                         reason says why (docs/destinations.md); absent when not checked
//	inbox_processed_total{consumer}          deliveries applied
//	inbox_duplicates_total{consumer}         deliveries dropped as duplicates
//	inbox_early_total{consumer}              deliveries refused because an earlier event is missing
//	inbox_errors_total{consumer}             deliveries whose effect or transaction failed
//	inbox_handle_seconds{consumer}           histogram: Handle's duration
//
// Sampled from the database (Config.Admin), at most once per
// Config.GaugesMaxAge whatever the number of scrapes, by one read-only
// transaction whose cost grows with the backlog, not with the history kept:
//
//	outbox_pending_events                    unpublished, not quarantined
//	outbox_oldest_pending_age_seconds        age of the oldest pending event (0 when none)
//	outbox_quarantined_events                quarantined events
//	outbox_leased_events                     events under a live lease (in flight)
//	outbox_expired_leases                    events whose lease expired before they were settled
//	outbox_relays_alive                      relays whose heartbeat has not expired
//	outbox_table_bytes{table}                total size of each outbox table
//	outbox_gauges_errors_total               failed samples (the gauges are then left out of the scrape)
//
// Sampled the same way from the inbox tables (Config.Inbox), for every
// consumer with a high-water mark in the schema:
//
//	inbox_waiting_aggregates{consumer}          aggregates waiting on a gap (an event refused as early, none applied since)
//	inbox_oldest_waiting_age_seconds{consumer}  age of the oldest wait (0 when none)
//
// Side effects (package sideeffect): the sideeffect_* series, listed in
// sideeffect.go, counted as Metrics observes a sideeffect.Caller and sampled
// from Config.SideEffects.
//
// Several relays of one schema export the same database gauges: aggregate
// them with max(), not sum(). deploy/prometheus/outbox-alerts.yml has example
// alert rules and deploy/grafana/outbox-dashboard.json a dashboard.
package outboxprom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/sideeffect"
)

// Defaults for Config.
const (
	GaugesMaxAgeDefault  = 10 * time.Second
	GaugesTimeoutDefault = 5 * time.Second
)

// Config configures Metrics.
type Config struct {
	// Schema is the value of the schema label, as a plain string: the
	// older field, kept working; prefer Tables. Defaults to "outbox".
	Schema string
	// Tables is the schema the metrics are of, the value of the schema
	// label: the one outbox.Schema value an application gives every
	// component's config. Setting it and Schema to different names is
	// refused (outbox.ErrSchemaConflict). Defaults to Schema, then
	// "outbox".
	Tables outbox.Schema
	// Admin, when set, is sampled for the database gauges. Optional.
	Admin *outbox.Admin
	// Inbox, when set, is sampled for the inbox gauges (aggregates waiting
	// on a gap), in the same sample as Admin's. Set it in the process that
	// exports a consumer's metrics, or in a relay whose schema also holds
	// consumers' inboxes. Optional.
	Inbox *inbox.Admin
	// SideEffects, when set, is sampled for the side-effect gauges (open
	// attempts by state, the oldest unknown age), in the same sample. Set it
	// in the process that exports a consumer's metrics. Optional.
	SideEffects *sideeffect.Admin
	// GaugesMaxAge is how long a database sample is reused: scrapes within
	// it get the same values, so any number of scrapers cost at most one
	// query per GaugesMaxAge. Defaults to GaugesMaxAgeDefault.
	GaugesMaxAge time.Duration
	// GaugesTimeout bounds one sample. Defaults to GaugesTimeoutDefault.
	GaugesTimeout time.Duration
	// Logger receives a warning when a sample fails. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// ConstLabels are added to every series, beside schema: package
	// outboxfleet sets source and database, so that the metrics of many
	// sources can share one registry. Optional.
	ConstLabels map[string]string
}

// Metrics collects the outbox's metrics. Register it with a
// prometheus.Registerer and pass it as the observer of the relay, the Admin
// and inboxes. It is safe for concurrent use.
type Metrics struct {
	cfg Config

	claimed, published, quarantined, expired, conflicts, gaugeErrors prometheus.Counter
	failures                                                         *prometheus.CounterVec
	cleanupDeleted                                                   *prometheus.CounterVec
	attempts, ackLatency, commitToPublish                            prometheus.Histogram
	statements                                                       *prometheus.HistogramVec
	relayUp, destUnavailable, refusedRoutes                          prometheus.Gauge
	ackDurable                                                       *prometheus.GaugeVec
	inboxProcessed, inboxDuplicates, inboxEarly, inboxErrors         *prometheus.CounterVec
	inboxSeconds                                                     *prometheus.HistogramVec

	relayMu sync.Mutex
	relayOn bool // outbox_relay_up and the destination gauges are exported once a relay reported
	ackOn   bool // outbox_destination_ack_durable is exported once a relay checked

	pendingDesc, oldestDesc, quarantinedDesc, leasedDesc, expiredDesc, relaysDesc, tableBytesDesc *prometheus.Desc
	inboxWaitingDesc, inboxOldestWaitDesc                                                         *prometheus.Desc
	se                                                                                            *sideEffectMetrics

	mu       sync.Mutex // one sample at a time
	sampled  time.Time
	last     sample
	gaugesOK bool
}

// sample is one reading of the database gauges.
type sample struct {
	outbox   outbox.Gauges
	outboxOK bool
	inbox    []inbox.ConsumerWaiting
	inboxOK  bool
	se       []sideeffect.Gauges
	seOK     bool
}

var (
	_ prometheus.Collector   = (*Metrics)(nil)
	_ outbox.ClaimObserver   = (*Metrics)(nil)
	_ outbox.PublishObserver = (*Metrics)(nil)
	_ outbox.SettleObserver  = (*Metrics)(nil)
	_ outbox.CleanupObserver = (*Metrics)(nil)
	_ inbox.Observer         = (*Metrics)(nil)
)

// New returns Metrics for cfg. Nothing is registered yet.
func New(cfg Config) (*Metrics, error) {
	schema, err := pgident.PickName(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outboxprom: %w", err)
	}
	cfg.Schema = outbox.Schema(schema).Name()
	if cfg.GaugesMaxAge < 0 || cfg.GaugesTimeout < 0 {
		return nil, errors.New("outboxprom: GaugesMaxAge and GaugesTimeout must not be negative")
	}
	if cfg.GaugesMaxAge == 0 {
		cfg.GaugesMaxAge = GaugesMaxAgeDefault
	}
	if cfg.GaugesTimeout == 0 {
		cfg.GaugesTimeout = GaugesTimeoutDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	labels := prometheus.Labels{"schema": cfg.Schema}
	for k, v := range cfg.ConstLabels {
		if k == "schema" {
			return nil, errors.New("outboxprom: ConstLabels must not set schema (it is Config.Schema)")
		}
		labels[k] = v
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	counterVec := func(name, help string, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, []string{label})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	desc := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, variable, labels)
	}
	latency := prometheus.ExponentialBuckets(0.0005, 2, 17) // 0.5 ms .. 33 s
	m := &Metrics{
		cfg:         cfg,
		claimed:     counter("outbox_claimed_events_total", "Events claimed by the relay (re-claims after failures included)."),
		published:   counter("outbox_published_total", "Events acknowledged by the destination and marked published."),
		quarantined: counter("outbox_quarantined_total", "Events quarantined by this process (permanent error or too many attempts)."),
		expired:     counter("outbox_expired_claims_total", "Events claimed from another relay's expired lease (take-overs)."),
		conflicts:   counter("outbox_lease_conflicts_total", "Write-backs refused because another relay had taken the events over."),
		gaugeErrors: counter("outbox_gauges_errors_total", "Failed samples of the database gauges."),
		failures:    counterVec("outbox_failures_total", "Failed publish attempts, by reason (retryable, permanent, unavailable).", "reason"),
		cleanupDeleted: counterVec("outbox_cleanup_deleted_total",
			"Rows deleted by clean-up, by table (outbox_events, processed_events).", "table"),
		attempts: histogram("outbox_publish_attempts", "The attempt on which an event was published (1: the first).",
			[]float64{1, 2, 3, 5, 8, 13, 20, 50}),
		ackLatency: histogram("outbox_broker_ack_seconds", "Time the destination took to acknowledge an event (its Publish call).", latency),
		commitToPublish: histogram("outbox_commit_to_publish_seconds", "Time from an event's occurred_at to the destination's acknowledgement.",
			[]float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}),
		statements: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outbox_db_statement_seconds",
			Help:        "Round trips of the relay's statements, by statement (claim, full_scan, mark_published, record_failures, release).",
			ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12)}, []string{"statement"}),
		relayUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_up", ConstLabels: labels,
			Help: "1 while the relay's last claim reached the database, 0 after a failed one."}),
		destUnavailable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_destination_unavailable", ConstLabels: labels,
			Help: "1 while the relay finds the destination unavailable as a whole (two looks in a row), else 0."}),
		refusedRoutes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_destination_refused_routes", ConstLabels: labels,
			Help: "Routes (routing keys, topics) the destination refuses whose events the relay holds back."}),
		ackDurable: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_destination_ack_durable", ConstLabels: labels,
			Help: "1 when the destination's acknowledgement survives the loss of the server that gave it, 0 when an event marked published can be lost with the broker (checked at relay start; reason says why)."},
			[]string{"destination", "reason"}),
		inboxProcessed:  counterVec("inbox_processed_total", "Deliveries applied by the consumer's inbox.", "consumer"),
		inboxDuplicates: counterVec("inbox_duplicates_total", "Deliveries dropped by the inbox as duplicates.", "consumer"),
		inboxEarly:      counterVec("inbox_early_total", "Deliveries refused by the inbox because an earlier event of the aggregate is missing.", "consumer"),
		inboxErrors:     counterVec("inbox_errors_total", "Deliveries whose effect or transaction failed.", "consumer"),
		inboxSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "inbox_handle_seconds", ConstLabels: labels,
			Help: "Time the inbox took to handle a delivery, transaction included.", Buckets: latency}, []string{"consumer"}),

		pendingDesc:     desc("outbox_pending_events", "Unpublished events that are not quarantined (sampled from the database)."),
		oldestDesc:      desc("outbox_oldest_pending_age_seconds", "Age of the oldest pending event since its occurred_at, 0 when none is pending."),
		quarantinedDesc: desc("outbox_quarantined_events", "Quarantined events (sampled from the database)."),
		leasedDesc:      desc("outbox_leased_events", "Events under a live lease, being published (sampled from the database)."),
		expiredDesc:     desc("outbox_expired_leases", "Events whose lease expired before they were settled (sampled from the database)."),
		relaysDesc:      desc("outbox_relays_alive", "Relays whose heartbeat has not expired (sampled from the database)."),
		tableBytesDesc:  desc("outbox_table_bytes", "Total size of an outbox table, indexes and TOAST included.", "table"),
		inboxWaitingDesc: desc("inbox_waiting_aggregates",
			"Aggregates whose inbox refused an event as early and applied none since: waiting on a gap (sampled from the database).", "consumer"),
		inboxOldestWaitDesc: desc("inbox_oldest_waiting_age_seconds",
			"Age of the consumer's oldest wait on a gap, 0 when none (sampled from the database).", "consumer"),
	}
	m.se = newSideEffectMetrics(labels, latency)
	// Known label values exist from the start, so that rates and alerts see 0
	// rather than no series.
	for _, r := range []outbox.FailureReason{outbox.FailureRetryable, outbox.FailurePermanent, outbox.FailureUnavailable} {
		m.failures.WithLabelValues(string(r))
	}
	for _, t := range []string{"outbox_events", "processed_events"} {
		m.cleanupDeleted.WithLabelValues(t)
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{m.claimed, m.published, m.quarantined, m.expired, m.conflicts, m.gaugeErrors,
		m.failures, m.cleanupDeleted, m.attempts, m.ackLatency, m.commitToPublish, m.statements,
		m.inboxProcessed, m.inboxDuplicates, m.inboxEarly, m.inboxErrors, m.inboxSeconds}
	return append(cs, m.se.collectors()...)
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	m.relayUp.Describe(ch)
	m.destUnavailable.Describe(ch)
	m.refusedRoutes.Describe(ch)
	m.ackDurable.Describe(ch)
	for _, d := range []*prometheus.Desc{m.pendingDesc, m.oldestDesc, m.quarantinedDesc, m.leasedDesc, m.expiredDesc, m.relaysDesc, m.tableBytesDesc,
		m.inboxWaitingDesc, m.inboxOldestWaitDesc, m.se.attemptsDesc, m.se.oldestDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It samples the database when the
// last sample is older than GaugesMaxAge; a failed sample leaves the
// database gauges out of this scrape and counts outbox_gauges_errors_total.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	var smp sample
	if m.cfg.Admin != nil || m.cfg.Inbox != nil || m.cfg.SideEffects != nil {
		smp = m.sample() // first, so that a failure counts in this scrape
	}
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
	m.relayMu.Lock()
	if m.relayOn {
		m.relayUp.Collect(ch)
		m.destUnavailable.Collect(ch)
		m.refusedRoutes.Collect(ch)
	}
	if m.ackOn {
		m.ackDurable.Collect(ch)
	}
	m.relayMu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if smp.inboxOK {
		for _, c := range smp.inbox {
			gauge(m.inboxWaitingDesc, float64(c.Waiting), c.Consumer)
			gauge(m.inboxOldestWaitDesc, c.OldestWaitSeconds, c.Consumer)
		}
	}
	if smp.seOK {
		m.se.collectGauges(ch, smp.se)
	}
	if !smp.outboxOK {
		return
	}
	g := smp.outbox
	gauge(m.pendingDesc, float64(g.Pending))
	gauge(m.oldestDesc, g.OldestPendingAgeSeconds)
	gauge(m.quarantinedDesc, float64(g.Quarantined))
	gauge(m.leasedDesc, float64(g.Leased))
	gauge(m.expiredDesc, float64(g.ExpiredLeases))
	gauge(m.relaysDesc, float64(g.RelaysAlive))
	for table, size := range g.TableBytes {
		gauge(m.tableBytesDesc, float64(size), table)
	}
}

// sample reads the database gauges, or returns the last reading while it is
// younger than GaugesMaxAge. A reading with a failed part is not reused.
func (m *Metrics) sample() sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gaugesOK && time.Since(m.sampled) < m.cfg.GaugesMaxAge {
		return m.last
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.GaugesTimeout)
	defer cancel()
	var s sample
	failed := false
	if m.cfg.Admin != nil {
		g, err := m.cfg.Admin.Gauges(ctx)
		if err != nil {
			failed = true
			m.cfg.Logger.Warn("sample outbox gauges", slog.String("schema", m.cfg.Schema), slog.Any("error", err))
		} else {
			s.outbox, s.outboxOK = g, true
		}
	}
	if m.cfg.Inbox != nil {
		w, err := m.cfg.Inbox.Gauges(ctx)
		if err != nil {
			failed = true
			m.cfg.Logger.Warn("sample inbox gauges", slog.String("schema", m.cfg.Schema), slog.Any("error", err))
		} else {
			s.inbox, s.inboxOK = w, true
		}
	}
	if m.cfg.SideEffects != nil {
		g, err := m.cfg.SideEffects.Gauges(ctx)
		if err != nil {
			failed = true
			m.cfg.Logger.Warn("sample side-effect gauges", slog.String("schema", m.cfg.Schema), slog.Any("error", err))
		} else {
			s.se, s.seOK = g, true
		}
	}
	if failed {
		m.gaugeErrors.Inc()
		m.gaugesOK = false
		return s
	}
	m.last, m.gaugesOK, m.sampled = s, true, time.Now()
	return s
}

// ObserveClaim implements outbox.ClaimObserver.
func (m *Metrics) ObserveClaim(o outbox.ClaimObservation) {
	statement := "claim"
	if o.FullScan {
		statement = "full_scan"
	}
	m.statements.WithLabelValues(statement).Observe(o.Duration.Seconds())
	m.relayMu.Lock()
	m.relayOn = true
	m.relayMu.Unlock()
	if o.Err != nil {
		m.relayUp.Set(0)
		return
	}
	m.relayUp.Set(1)
	m.claimed.Add(float64(o.Events))
	m.expired.Add(float64(o.TakenOver))
}

// ObserveDestination implements outbox.DestinationObserver.
func (m *Metrics) ObserveDestination(o outbox.DestinationObservation) {
	m.relayMu.Lock()
	m.relayOn = true
	m.relayMu.Unlock()
	v := 0.0
	if o.Unavailable {
		v = 1
	}
	m.destUnavailable.Set(v)
	m.refusedRoutes.Set(float64(o.RefusedRoutes))
}

var _ outbox.DurabilityObserver = (*Metrics)(nil)

// ObserveAckDurability implements outbox.DurabilityObserver: the relay's
// start-up check sets outbox_destination_ack_durable (one series, the last
// check's); a publisher that cannot be checked leaves it out.
func (m *Metrics) ObserveAckDurability(a outbox.AckDurability) {
	m.relayMu.Lock()
	defer m.relayMu.Unlock()
	if !a.Checked {
		return
	}
	m.ackDurable.Reset()
	v := 0.0
	if a.Durable {
		v = 1
	}
	m.ackDurable.WithLabelValues(a.Destination, a.Reason).Set(v)
	m.ackOn = true
}

// ObservePublish implements outbox.PublishObserver.
func (m *Metrics) ObservePublish(o outbox.PublishObservation) {
	m.ackLatency.Observe(o.AckLatency.Seconds())
	if o.Err != nil {
		m.failures.WithLabelValues(string(o.Reason)).Inc()
		if o.Quarantined {
			m.quarantined.Inc()
		}
		return
	}
	m.attempts.Observe(float64(o.Attempt))
	m.commitToPublish.Observe(o.CommitToAck.Seconds())
}

// ObserveSettle implements outbox.SettleObserver.
func (m *Metrics) ObserveSettle(o outbox.SettleObservation) {
	m.statements.WithLabelValues(string(o.Op)).Observe(o.Duration.Seconds())
	if o.Err != nil {
		return
	}
	m.conflicts.Add(float64(o.LeaseConflicts))
	if o.Op == outbox.SettleMarkPublished {
		m.published.Add(float64(o.Events - o.LeaseConflicts))
	}
}

// ObserveCleanup implements outbox.CleanupObserver.
func (m *Metrics) ObserveCleanup(o outbox.CleanupObservation) {
	m.cleanupDeleted.WithLabelValues(o.Table).Add(float64(o.Deleted))
}

// ObserveHandle implements inbox.Observer.
// Each consumer's four counters exist from its first delivery on, so that
// their rates are 0 rather than missing.
func (m *Metrics) ObserveHandle(o inbox.HandleObservation) {
	m.inboxSeconds.WithLabelValues(o.Consumer).Observe(o.Duration.Seconds())
	errs, processed := m.inboxErrors.WithLabelValues(o.Consumer), m.inboxProcessed.WithLabelValues(o.Consumer)
	dups, early := m.inboxDuplicates.WithLabelValues(o.Consumer), m.inboxEarly.WithLabelValues(o.Consumer)
	switch {
	case o.Err != nil:
		errs.Inc()
	case o.Outcome == inbox.Applied:
		processed.Inc()
	case o.Outcome == inbox.Duplicate:
		dups.Inc()
	case o.Outcome == inbox.Early:
		early.Inc()
	}
}

// Handler serves g's metrics on /metrics (Prometheus text), /healthz (200
// while the process serves) and /readyz (200 when ready returns nil, else
// 503 with the reason; always 200 when ready is nil).
func Handler(g prometheus.Gatherer, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready != nil {
			if err := ready(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ready: %v\n", err)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}
