package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/outboxprom"
)

// relayOpsFlags are the relay's operational flags: metrics and periodic
// clean-up horizons.
type relayOpsFlags struct {
	metricsAddr  string
	gaugesMaxAge time.Duration
	horizons     cleanupFlags
}

func (o *relayOpsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&o.metricsAddr, "metrics-addr", cli.Env("OUTBOX_METRICS_ADDR", ""),
		"serve Prometheus metrics on /metrics, and /healthz and /readyz, at this address, e.g. :9464 (env OUTBOX_METRICS_ADDR)")
	fs.DurationVar(&o.gaugesMaxAge, "metrics-db-interval", outboxprom.GaugesMaxAgeDefault,
		"how long a database sample (pending, oldest age, quarantined, sizes) is reused across scrapes")
	fs.Var(&o.horizons.olderThan, "cleanup-older-than",
		"delete settled events published longer ago than `DURATION`, periodically (the replay horizon, e.g. 7d; default never)")
	fs.Var(&o.horizons.inboxOlderThan, "cleanup-inbox-older-than",
		"also delete inbox rows processed longer ago than `DURATION` (not shorter than --cleanup-older-than)")
}

// metrics returns the Prometheus metrics when --metrics-addr is set, else nil.
func (o *relayOpsFlags) metrics(pool *pgxpool.Pool, schema string, log *slog.Logger) (*outboxprom.Metrics, error) {
	if o.metricsAddr == "" {
		return nil, nil
	}
	if o.gaugesMaxAge < 0 {
		return nil, fmt.Errorf("--metrics-db-interval %s is negative", o.gaugesMaxAge)
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		return nil, err
	}
	// The schema's inbox tables too: consumers whose inbox lives in this
	// database and schema are reported (aggregates waiting on a gap).
	inboxAdmin, err := inbox.NewAdmin(pool, inbox.AdminConfig{Schema: schema})
	if err != nil {
		return nil, err
	}
	return outboxprom.New(outboxprom.Config{Schema: schema, Admin: admin, Inbox: inboxAdmin, GaugesMaxAge: o.gaugesMaxAge, Logger: log})
}

// serve starts the metrics server when m is set, with the extra collectors
// beside m. It logs the address it
// listens on (useful with port 0) and returns the function that stops it.
func (o *relayOpsFlags) serve(m *outboxprom.Metrics, ready func() error, log *slog.Logger, extra ...prometheus.Collector) (func(), error) {
	if m == nil {
		return func() {}, nil
	}
	reg := prometheus.NewRegistry()
	for _, c := range append([]prometheus.Collector{m}, extra...) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", o.metricsAddr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: outboxprom.Handler(reg, ready), ReadHeaderTimeout: 10 * time.Second}
	log.Info("metrics listening", slog.String("addr", ln.Addr().String()), slog.Int("pid", os.Getpid()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", slog.Any("error", err))
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
