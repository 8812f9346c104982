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

	active, lagBytes, retained, safe, lagSeconds, walStatus *prometheus.Desc
	received, published, left, outages, invalidations       *prometheus.Desc
	streaming                                               *prometheus.Desc
}

func newCDCCollector(pool *pgxpool.Pool, schema string, log *slog.Logger) *cdcCollector {
	slot := []string{"slot"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_cdc_"+name, help, labels, prometheus.Labels{"schema": schema})
	}
	return &cdcCollector{
		pool: pool, schema: schema, log: log,
		active:        d("slot_active", "1 when a relay streams the slot.", slot),
		lagBytes:      d("slot_lag_bytes", "WAL written since the slot's confirmed position.", slot),
		retained:      d("slot_retained_bytes", "WAL the slot keeps on disk (since its restart_lsn).", slot),
		safe:          d("slot_safe_wal_bytes", "WAL that can still be written before the slot is lost (absent when max_slot_wal_keep_size is unlimited).", slot),
		lagSeconds:    d("slot_lag_seconds", "The streaming relay's flush lag as PostgreSQL measures it (absent when idle or not streamed).", slot),
		walStatus:     d("slot_wal_status", "1 for the slot's wal_status (reserved, extended, unreserved, lost).", []string{"slot", "status"}),
		received:      d("events_received_total", "Event ids this relay read from committed transactions.", nil),
		published:     d("events_published_total", "Events this relay's CDC path published.", nil),
		left:          d("events_left_total", "Event ids this relay's CDC path left to the polling path.", nil),
		outages:       d("outages_total", "Publish calls of the CDC path that found the destination unavailable.", nil),
		invalidations: d("slot_invalidations_total", "Times this relay found its slot invalidated and recreated it.", nil),
		streaming:     d("streaming", "1 when this relay streams its slot (0: standing by or reconnecting).", nil),
	}
}

// Describe implements prometheus.Collector.
func (c *cdcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.active, c.lagBytes, c.retained, c.safe, c.lagSeconds, c.walStatus,
		c.received, c.published, c.left, c.outages, c.invalidations, c.streaming} {
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
		counter(c.left, st.Left())
		counter(c.outages, st.Outages())
		counter(c.invalidations, st.Invalidations())
		ch <- prometheus.MustNewConstMetric(c.streaming, prometheus.GaugeValue, boolValue(st.Streaming()))
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
