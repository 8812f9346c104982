package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/internal/cli"
)

// faultFlags collects repeated --fault flags (and PROVIDER_FAULTS).
type faultFlags struct{ rules []provider.Rule }

func (f *faultFlags) String() string {
	s := make([]string, len(f.rules))
	for i, r := range f.rules {
		s[i] = r.String()
	}
	return strings.Join(s, ";")
}

func (f *faultFlags) Set(v string) error {
	for part := range strings.SplitSeq(v, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		r, err := provider.ParseRule(part)
		if err != nil {
			return err
		}
		f.rules = append(f.rules, r)
	}
	return nil
}

func runProvider(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "provider", `provider [flags]

Runs the fake payment provider: POST /charges, POST /refunds, GET /charges/{id},
GET /charges?key=K (idempotent mode), GET /charges?reference=R (queryable mode),
the same for /refunds, and GET /ledger (every captured charge and refund, with
totals per reference). Its tables live in their own schema (--schema), migrated
at start, so charges survive crashes of its callers and of itself.

--mode idempotent honours Idempotency-Key (replay, 422 on reuse with another
request, 409 while in flight); queryable ignores keys but answers lookups by
reference; neither ignores keys and answers no lookup.

--fault KIND[:key=value,...] injects faults into POST /charges and /refunds
(repeatable; ';' separates several in one value): latency, error-before-commit,
error-after-commit, timeout-after-commit, drop-response, crash. Keys: on
(charges|refunds), p (probability), after (skip N), next (fire N times),
latency, jitter, hang. E.g. --fault timeout-after-commit:p=0.1 --fault
crash:after=2,next=1. --control-listen serves GET/POST /control/faults on a
separate address (off unless set). Stops on SIGINT/SIGTERM.`)
	var common cli.Common
	fs.StringVar(&common.DatabaseURL, "database-url", cli.Env("DATABASE_URL", cli.DatabaseURLDefault), "PostgreSQL connection URL (env DATABASE_URL)")
	schema := fs.String("schema", cli.Env("PROVIDER_SCHEMA", provider.SchemaDefault), "PostgreSQL schema of the provider's tables (env PROVIDER_SCHEMA)")
	listen := fs.String("listen", cli.Env("PROVIDER_LISTEN", "127.0.0.1:8090"), "address to serve the provider API on (env PROVIDER_LISTEN)")
	control := fs.String("control-listen", cli.Env("PROVIDER_CONTROL_LISTEN", ""), "address to serve /control/faults on; empty: no control API (env PROVIDER_CONTROL_LISTEN)")
	mode := fs.String("mode", cli.Env("PROVIDER_MODE", string(provider.ModeIdempotent)), "idempotent, queryable or neither (env PROVIDER_MODE)")
	declineAbove := fs.Int64("decline-above", int64(envUint("PROVIDER_DECLINE_ABOVE", provider.DeclineAboveDefault)),
		"decline charges of a larger amount (minor units) with 402 (env PROVIDER_DECLINE_ABOVE)")
	var faults faultFlags
	if v := cli.Env("PROVIDER_FAULTS", ""); v != "" {
		if err := faults.Set(v); err != nil {
			return fmt.Errorf("PROVIDER_FAULTS: %w", err)
		}
	}
	fs.Var(&faults, "fault", "inject a fault, KIND[:key=value,...] (repeatable; env PROVIDER_FAULTS, ';'-separated)")
	seed := fs.Uint64("fault-seed", envUint("PROVIDER_FAULT_SEED", 0), "seed of the fault draws; 0 picks one and logs it (env PROVIDER_FAULT_SEED)")
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "how long to finish in-flight requests on shutdown")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	m, err := provider.ParseMode(*mode)
	if err != nil {
		return err
	}
	log := logger()
	pool, err := common.Connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	svc, err := provider.New(pool, provider.Config{Schema: *schema, Mode: m, DeclineAbove: *declineAbove,
		Faults: provider.Faults{Seed: *seed, Rules: faults.rules}, Logger: log})
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil {
		return err
	}
	servers := []*http.Server{{Handler: svc.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	servers[0].RegisterOnShutdown(svc.StopHanging)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	listeners := []net.Listener{ln}
	controlAddr := ""
	if *control != "" {
		cln, err := net.Listen("tcp", *control)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("control listen: %w", err)
		}
		controlAddr = cln.Addr().String()
		listeners = append(listeners, cln)
		servers = append(servers, &http.Server{Handler: svc.ControlHandler(), ReadHeaderTimeout: 10 * time.Second})
	}
	st := svc.FaultStatus()
	log.Info("provider listening", slog.String("addr", ln.Addr().String()), slog.String("control", controlAddr),
		slog.String("mode", string(m)), slog.String("schema", *schema), slog.String("faults", faults.String()), slog.Uint64("fault_seed", st.Seed))
	g, gctx := errgroup.WithContext(ctx)
	for i, srv := range servers {
		g.Go(func() error {
			if err := srv.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), *shutdown)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	err = g.Wait()
	log.Info("provider stopped", slog.Any("injected", svc.FaultStatus().Injected))
	return err
}

// envUint reads a number from the environment variable key; def when it
// is unset or not a number.
func envUint(key string, def uint64) uint64 {
	v, err := strconv.ParseUint(cli.Env(key, strconv.FormatUint(def, 10)), 10, 64)
	if err != nil {
		return def
	}
	return v
}

var _ flag.Value = (*faultFlags)(nil)
