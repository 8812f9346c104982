package main

// Metrics of `outbox relay --mode cdc|reconcile`: the schema's CDC slots
// (read from pg_replication_slots at each scrape) and the CDC relay's
// counters.

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox/outboxcdc"
)

// cdcCollector reports the CDC slots and, once it runs, the CDC relay.
type cdcCollector struct {
	pool   *pgxpool.Pool
	schema string
	log    *slog.Logger
	relay  atomic.Pointer[outboxcdc.Relay]

	active, lagBytes, retained, redecode, safe, lagSeconds, walStatus   *prometheus.Desc
	received, published, alreadyPublished, left, outages, invalidations *prometheus.Desc
	queued, waiting, deferred, rewinds                                  *prometheus.Desc
	streaming, standingBy, standbyChecks, takeovers                     *prometheus.Desc
}

func newCDCCollector(pool *pgxpool.Pool, schema string, log *slog.Logger) *cdcCollector {
	slot := []string{"slot"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_cdc_"+name, help, labels, prometheus.Labels{"schema": schema})
	}
	return &cdcCollector{
		pool: pool, schema: schema, log: log,
		active:           d("slot_active", "1 when a relay streams the slot.", slot),
		lagBytes:         d("slot_lag_bytes", "WAL written since the slot's confirmed position.", slot),
		retained:         d("slot_retained_bytes", "WAL the slot keeps on disk (since its restart_lsn).", slot),
		redecode:         d("slot_redecode_bytes", "WAL between the slot's restart_lsn and its confirmed position: what PostgreSQL decodes again before anything new each time a relay starts streaming the slot (restart, takeover).", slot),
		safe:             d("slot_safe_wal_bytes", "WAL that can still be written before the slot is lost (absent when max_slot_wal_keep_size is unlimited).", slot),
		lagSeconds:       d("slot_lag_seconds", "The streaming relay's flush lag as PostgreSQL measures it (absent when idle or not streamed).", slot),
		walStatus:        d("slot_wal_status", "1 for the slot's wal_status (reserved, extended, unreserved, lost).", []string{"slot", "status"}),
		received:         d("events_received_total", "Event ids this relay read from committed transactions.", nil),
		published:        d("events_published_total", "Events this relay's CDC path published.", nil),
		alreadyPublished: d("events_already_published_total", "Event ids this relay's CDC path read and found published already (read again after a restart, or published by another relay).", nil),
		left:             d("events_left_total", "Event ids this relay's CDC path left to the polling safety net (parked behind a quarantine, blocked past the wait limit, or not found).", nil),
		queued:           d("events_queued", "Event ids read and not finished by this relay's CDC path (bounded by its queue).", nil),
		waiting:          d("events_waiting", "Event ids this relay's CDC path could not publish yet and hands over again (behind an unpublished event, leased elsewhere, backing off).", nil),
		deferred:         d("events_deferred_total", "Event ids read and not queued because the queue was full; read again from the slot.", nil),
		rewinds:          d("rewinds_total", "Times this relay's stream started again from the slot's confirmed position to read deferred transactions.", nil),
		outages:          d("outages_total", "Publish calls of the CDC path that found the destination unavailable.", nil),
		invalidations:    d("slot_invalidations_total", "Times this relay found its slot invalidated and recreated it.", nil),
		streaming:        d("streaming", "1 when this relay streams its slot (0: standing by or reconnecting).", nil),
		standingBy:       d("standing_by", "1 when this relay stands by: another process streams its slot.", nil),
		standbyChecks:    d("standby_checks_total", "Times this relay, standing by, looked whether its slot was free.", nil),
		takeovers:        d("takeovers_total", "Times this relay started streaming its slot after standing by.", nil),
	}
}

// Describe implements prometheus.Collector.
func (c *cdcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.active, c.lagBytes, c.retained, c.redecode, c.safe, c.lagSeconds, c.walStatus,
		c.received, c.published, c.alreadyPublished, c.left, c.outages, c.invalidations,
		c.queued, c.waiting, c.deferred, c.rewinds, c.streaming, c.standingBy, c.standbyChecks, c.takeovers} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *cdcCollector) Collect(ch chan<- prometheus.Metric) {
	if r := c.relay.Load(); r != nil {
		st := r.Stats()
		counter := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
		}
		counter(c.received, st.Received())
		counter(c.published, st.Published())
		counter(c.alreadyPublished, st.AlreadyPublished())
		counter(c.left, st.Left())
		counter(c.outages, st.Outages())
		counter(c.invalidations, st.Invalidations())
		counter(c.deferred, st.Deferred())
		counter(c.rewinds, st.Rewinds())
		counter(c.standbyChecks, st.StandbyChecks())
		counter(c.takeovers, st.Takeovers())
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
		}
		gauge(c.queued, float64(st.Queued()))
		gauge(c.waiting, float64(st.Waiting()))
		gauge(c.streaming, boolValue(st.Streaming()))
		gauge(c.standingBy, boolValue(st.StandingBy()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	slots, err := outboxcdc.Slots(ctx, c.pool, c.schema)
	if err != nil {
		c.log.Warn("read the CDC slots for metrics", slog.Any("error", err))
		return
	}
	for _, s := range slots {
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{s.Slot}, labels...)...)
		}
		gauge(c.active, boolValue(s.Active))
		gauge(c.lagBytes, float64(s.LagBytes))
		gauge(c.retained, float64(s.RetainedBytes))
		gauge(c.redecode, float64(s.RedecodeBytes))
		if s.SafeWALBytes != nil {
			gauge(c.safe, float64(*s.SafeWALBytes))
		}
		if s.LagSeconds != nil {
			gauge(c.lagSeconds, *s.LagSeconds)
		}
		gauge(c.walStatus, 1, s.WALStatus)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
