package main

// `outbox relay --config relay.yaml`: one process for many outboxes
// (package outboxfleet). The flags that name one source (--schema,
// --database-url, --destination and the relay's tuning) are refused beside
// --config: the file says all of it.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/outboxfleet"
	"github.com/pgoutbox/outbox/outboxnats"
	"github.com/pgoutbox/outbox/outboxprom"
)

// fleetFlags are the flags that apply beside --config.
var fleetFlags = map[string]bool{"config": true, "metrics-addr": true, "sync-commit": true, "shutdown-timeout": true}

// checkFleetFlags refuses, beside --config, a flag given on the command line
// that the file replaces.
func checkFleetFlags(fs *flag.FlagSet) error {
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if !fleetFlags[f.Name] {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		sort.Strings(bad)
		return cli.Usagef(fs, "%s: not with --config (the configuration file lists the databases, sources and destinations; beside it only --metrics-addr, --sync-commit and --shutdown-timeout apply)", strings.Join(bad, ", "))
	}
	return nil
}

// runFleet serves the sources of the configuration file until ctx ends.
func runFleet(ctx context.Context, file, metricsAddr string, syncCommit bool, shutdown time.Duration, log *slog.Logger) error {
	cfg, err := outboxfleet.Load(file)
	if err != nil {
		return err
	}
	log.Info("fleet configuration", slog.String("file", file), slog.String("config", strings.TrimSpace(cfg.String())))
	reg := prometheus.NewRegistry()
	opts := outboxfleet.Options{
		Logger: log,
		ConfigurePool: func(c *pgxpool.Config) {
			for k, v := range outbox.RelaySessionParams(syncCommit) {
				if _, ok := c.ConnConfig.RuntimeParams[k]; !ok {
					c.ConnConfig.RuntimeParams[k] = v
				}
			}
			if _, ok := c.ConnConfig.RuntimeParams["application_name"]; !ok {
				c.ConnConfig.RuntimeParams["application_name"] = "outbox relay (fleet)"
			}
			// As for `outbox relay`: ping only connections idle for a
			// minute (an idle source's statements are rare).
			c.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > time.Minute }
		},
		ConfigureRelay: func(_ string, rc *outbox.RelayConfig) {
			if shutdown > 0 {
				rc.ShutdownTimeout = shutdown
			}
		},
		OpenDestination: func(ctx context.Context, name, u string) (outbox.Publisher, func(), error) {
			w := &fleetWaiter{what: "destination " + name, log: log}
			return destination.OpenWait(ctx, destination.Options{URL: u,
				NATSStream:        cli.Env("OUTBOX_NATS_STREAM", outboxnats.StreamDefault),
				NATSSubjectPrefix: cli.Env("OUTBOX_NATS_SUBJECT_PREFIX", outboxnats.SubjectPrefixDefault),
				Source:            cli.Env("OUTBOX_SOURCE", outboxnats.SourceDefault),
				DuplicateWindow:   outboxnats.DuplicateWindowDefault,
			}, w.retry)
		},
	}
	if metricsAddr != "" {
		opts.Registerer = reg
	}
	f, err := outboxfleet.New(cfg, opts)
	if err != nil {
		return err
	}
	defer f.Close()
	if metricsAddr != "" {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		ln, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		srv := &http.Server{Handler: outboxprom.Handler(reg, f.Ready), ReadHeaderTimeout: 10 * time.Second}
		log.Info("metrics listening", slog.String("addr", ln.Addr().String()), slog.Int("pid", os.Getpid()))
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", slog.Any("error", err))
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	return f.Run(ctx)
}

// fleetWaiter logs and pauses while a destination cannot be reached at
// start.
type fleetWaiter struct {
	what     string
	log      *slog.Logger
	attempts int
}

func (w *fleetWaiter) retry(ctx context.Context, err error) error {
	w.attempts++
	d := startBackoff(w.attempts)
	w.log.Warn("waiting for the "+w.what, slog.Any("error", err), slog.Int("attempt", w.attempts), slog.Duration("retry_in", d))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
