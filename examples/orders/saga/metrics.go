package saga

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
)

// Collector exports the sagas' gauges, read from the order service's
// tables at each scrape: orders_sagas{state} (how many sagas are in each
// state) and orders_saga_needs_attention_oldest_seconds (how long the
// oldest saga needing attention has waited; 0 when none does). Alert on
// orders_sagas{state="needs_attention"} > 0.
func Collector(svc *ordersapi.Service) prometheus.Collector {
	return &collector{svc: svc,
		sagas:  prometheus.NewDesc("orders_sagas", "Order sagas by state.", []string{"state"}, nil),
		oldest: prometheus.NewDesc("orders_saga_needs_attention_oldest_seconds", "Age of the oldest saga needing attention (0: none).", nil, nil),
	}
}

type collector struct {
	svc           *ordersapi.Service
	sagas, oldest *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.sagas; ch <- c.oldest }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.svc.SagaCounts(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.sagas, err)
		return
	}
	for _, st := range []string{ordersapi.SagaStarted, ordersapi.SagaStockReserved, ordersapi.SagaConfirmed, ordersapi.SagaCancelled, ordersapi.SagaNeedsAttention} {
		ch <- prometheus.MustNewConstMetric(c.sagas, prometheus.GaugeValue, float64(counts[st]), st)
	}
	age := 0.0
	if parked, err := c.svc.SagasNeedingAttention(ctx, 1); err == nil && len(parked) > 0 {
		age = time.Since(parked[0].Since).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
}
