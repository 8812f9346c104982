package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/examples/orders/payments"
	"github.com/pgoutbox/outbox/examples/orders/provider"
	"github.com/pgoutbox/outbox/examples/orders/saga"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/outboxprom"
)

// natsJS connects to the NATS destination URL (nats:// or tls://): the saga
// consumers read NATS JetStream only.
func natsJS(url, name string) (jetstream.JetStream, func(), error) {
	scheme, _, _ := strings.Cut(url, "://")
	if scheme != "nats" && scheme != "tls" {
		return nil, nil, fmt.Errorf("destination scheme %q not supported: the saga's consumers read NATS JetStream (nats://host:port)", scheme)
	}
	nc, err := destination.ConnectNATS(url, name)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, nc.Close, nil
}

func runPayments(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "payments", `payments [flags]

The saga's payments step. Consumes StockReserved (aggregate type inventory) and
OrderCancelled (aggregate type order) from NATS JetStream (--destination), each
through its own durable consumer "<durable>-<type>" and the inbox. For a
reserved order it charges the order's total at the provider (--provider-url)
through the side-effect helper, key "<order id>/charge", and records
PaymentCaptured or PaymentFailed through the outbox in the inbox transaction;
for a cancelled order whose charge was captured it refunds it, key
"<order id>/refund", and records PaymentRefunded, or RefundFailed when the
provider refused it. An ambiguous call is not acknowledged: the redelivery
resolves it with the same key; a reconciler looks unknown calls up meanwhile.
A refund still unknown after --refund-attempts deliveries (or parked) is
recorded as RefundUnknown (the saga waits, parked with the reason) and
resolved in the background: PaymentRefunded or RefundFailed once known. --provider-mode must be
the provider's --mode. Stops on SIGINT/SIGTERM.`)
	var common cli.Common
	var dest destination.Options
	common.Register(fs)
	fs.StringVar(&dest.URL, "destination", cli.Env("OUTBOX_DESTINATION", ""), "NATS URL the relay publishes to, nats://host:port (env OUTBOX_DESTINATION)")
	cli.RedactDefault(fs, "destination", destination.Redact)
	dest.RegisterNATS(fs)
	appSchema := appSchemaFlag(fs)
	var cfg payments.Config
	providerURL := fs.String("provider-url", cli.Env("PROVIDER_URL", "http://127.0.0.1:8090"), "the payment provider's base URL (env PROVIDER_URL)")
	mode := fs.String("provider-mode", cli.Env("PROVIDER_MODE", string(provider.ModeIdempotent)), "the provider's mode: idempotent, queryable or neither (env PROVIDER_MODE)")
	fs.BoolVar(&cfg.BlindRetry, "blind-retry", false, "mode neither only: call again after an unknown outcome (a counted possible duplicate) instead of parking it")
	fs.StringVar(&cfg.Durable, "durable", cli.Env("PAYMENTS_DURABLE", payments.DurableDefault), "JetStream durable consumer name prefix (env PAYMENTS_DURABLE)")
	fs.IntVar(&cfg.Workers, "workers", payments.WorkersDefault, "messages processed at once per aggregate type")
	fs.DurationVar(&cfg.AckWait, "ack-wait", payments.AckWaitDefault, "how long JetStream waits for an ack (must exceed --call-timeout)")
	fs.DurationVar(&cfg.CallTimeout, "call-timeout", 5*time.Second, "bound on each provider call and lookup")
	fs.IntVar(&cfg.RefundAttempts, "refund-attempts", payments.RefundAttemptsDefault, "deliveries of a cancellation whose refund stays unknown before RefundUnknown parks the saga (payments keeps resolving the refund)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if dest.URL == "" {
		return errors.New("no destination: set --destination or OUTBOX_DESTINATION (nats://127.0.0.1:4222)")
	}
	m, err := provider.ParseMode(*mode)
	if err != nil {
		return err
	}
	log := logger()
	if cfg.Workers <= 0 {
		cfg.Workers = payments.WorkersDefault
	}
	common.DatabaseURL = withPoolMaxConns(common.DatabaseURL, payments.PoolSize(cfg.Workers))
	pool, err := common.Connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := payments.Migrate(ctx, pool, common.Schema, *appSchema); err != nil {
		return err
	}
	js, closeNC, err := natsJS(dest.URL, "orders-payments")
	if err != nil {
		return err
	}
	defer closeNC()
	cfg.Schema, cfg.AppSchema, cfg.Mode, cfg.Logger = common.Schema, *appSchema, m, log
	cfg.Stream, cfg.SubjectPrefix = dest.NATSStream, dest.NATSSubjectPrefix
	cfg.Provider = provider.NewClient(*providerURL, "", payments.HTTPClient())
	cons, err := payments.New(pool, cfg)
	if err != nil {
		return err
	}
	err = cons.Run(ctx, js)
	log.Info("payments consumer stopped", "stats", cons.Stats())
	return err
}

const sagaUsage = `saga run|resolve|show|status [flags]

The order service's side of the saga.

  saga run       consume StockReserved/StockRejected (aggregate type inventory)
                 and PaymentCaptured/PaymentFailed/PaymentRefunded/RefundFailed/
                 RefundUnknown (aggregate type payment) from NATS JetStream:
                 confirm a paid order, cancel one whose stock was rejected or
                 whose payment failed (OrderCancelled: inventory releases,
                 payments refunds), park the saga as needs_attention when a
                 refund failed for good or its outcome is unknown (a later
                 PaymentRefunded ends it cancelled)
  saga show      print an order's saga (state and history) as JSON
  saga status    count the sagas by state, and list those needing attention
  saga resolve   settle a saga needing attention: --order ID --as
                 cancelled|confirmed --reason TEXT --by NAME (recorded)`

func runSaga(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "saga", sagaUsage)
	return cli.Dispatch(ctx, fs, args, []cli.Command{
		{Name: "run", Run: sagaRun},
		{Name: "show", Run: sagaShow},
		{Name: "status", Run: sagaStatus},
		{Name: "resolve", Run: sagaResolve},
	})
}

// sagaService connects and returns the order service (its tables migrated)
// and its pool.
func sagaService(ctx context.Context, common cli.Common, appSchema string) (*ordersapi.Service, *pgxpool.Pool, error) {
	pool, err := common.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	svc, err := ordersapi.New(pool, ordersapi.Config{Schema: common.Schema, AppSchema: appSchema, Logger: logger()})
	if err == nil {
		err = svc.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return svc, pool, nil
}

func sagaRun(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "saga run", "saga run [flags]\n\nRuns the saga consumer (see 'orders saga --help'); each of its two aggregate types\nhas its own durable consumer \"<durable>-<type>\". Stops on SIGINT/SIGTERM.")
	var common cli.Common
	var dest destination.Options
	common.Register(fs)
	fs.StringVar(&dest.URL, "destination", cli.Env("OUTBOX_DESTINATION", ""), "NATS URL the relay publishes to, nats://host:port (env OUTBOX_DESTINATION)")
	cli.RedactDefault(fs, "destination", destination.Redact)
	dest.RegisterNATS(fs)
	appSchema := appSchemaFlag(fs)
	var cfg saga.Config
	fs.StringVar(&cfg.Durable, "durable", cli.Env("SAGA_DURABLE", saga.DurableDefault), "JetStream durable consumer name prefix (env SAGA_DURABLE)")
	fs.IntVar(&cfg.Workers, "workers", saga.WorkersDefault, "messages processed at once per aggregate type")
	metrics := fs.String("metrics-listen", cli.Env("SAGA_METRICS_LISTEN", ""), "address to serve /metrics on (orders_sagas{state}, orders_saga_needs_attention_oldest_seconds); empty: none (env SAGA_METRICS_LISTEN)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if dest.URL == "" {
		return errors.New("no destination: set --destination or OUTBOX_DESTINATION (nats://127.0.0.1:4222)")
	}
	svc, pool, err := sagaService(ctx, common, *appSchema)
	if err != nil {
		return err
	}
	defer pool.Close()
	js, closeNC, err := natsJS(dest.URL, "orders-saga")
	if err != nil {
		return err
	}
	defer closeNC()
	cfg.Schema, cfg.Stream, cfg.SubjectPrefix, cfg.Logger = common.Schema, dest.NATSStream, dest.NATSSubjectPrefix, logger()
	cons, err := saga.New(pool, svc, cfg)
	if err != nil {
		return err
	}
	if *metrics != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(saga.Collector(svc))
		ln, err := net.Listen("tcp", *metrics)
		if err != nil {
			return fmt.Errorf("metrics listen: %w", err)
		}
		srv := &http.Server{Handler: outboxprom.Handler(reg, nil), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		cfg.Logger.Info("saga metrics listening", "addr", ln.Addr().String())
	}
	return cons.Run(ctx, js)
}

func sagaShow(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "saga show", "saga show --order ID [flags]\n\nPrints the order with its saga (state, reason, history) as JSON.")
	var common cli.Common
	common.Register(fs)
	appSchema := appSchemaFlag(fs)
	order := fs.String("order", "", "the order id")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *order == "" {
		return cli.Usagef(fs, "--order is required")
	}
	svc, pool, err := sagaService(ctx, common, *appSchema)
	if err != nil {
		return err
	}
	defer pool.Close()
	o, err := svc.Get(ctx, *order)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(o)
}

// sagaStates are the saga's states in the order saga status prints them.
var sagaStates = []string{ordersapi.SagaStarted, ordersapi.SagaStockReserved, ordersapi.SagaConfirmed, ordersapi.SagaCancelled, ordersapi.SagaNeedsAttention}

// sagaStatusJSON is 'orders saga status --json'.
type sagaStatusJSON struct {
	// Counts has every state, 0 included.
	Counts         map[string]int64     `json:"counts"`
	NeedsAttention []sagaNeedsAttention `json:"needs_attention"`
}

// sagaNeedsAttention is a parked saga in 'orders saga status --json'.
type sagaNeedsAttention struct {
	OrderID string    `json:"order_id"`
	Since   time.Time `json:"since"`
	Reason  string    `json:"reason"`
}

func sagaStatus(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "saga status", `saga status [--limit N] [--json] [flags]

Counts the sagas by state and lists the orders whose saga needs attention,
oldest first (at most --limit), with the reason. With --json, one JSON object:
{"counts": {"started": N, "stock_reserved": N, "confirmed": N, "cancelled": N,
"needs_attention": N}, "needs_attention": [{"order_id", "since", "reason"}]}.`)
	var common cli.Common
	common.Register(fs)
	appSchema := appSchemaFlag(fs)
	limit := fs.Int("limit", 20, "most sagas needing attention to list")
	asJSON := fs.Bool("json", false, "print the counts and the sagas needing attention as JSON")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *limit < 1 {
		return cli.Usagef(fs, "--limit %d must be positive", *limit)
	}
	svc, pool, err := sagaService(ctx, common, *appSchema)
	if err != nil {
		return err
	}
	defer pool.Close()
	counts, err := svc.SagaCounts(ctx)
	if err != nil {
		return err
	}
	parked, err := svc.SagasNeedingAttention(ctx, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		out := sagaStatusJSON{Counts: map[string]int64{}, NeedsAttention: []sagaNeedsAttention{}}
		for _, st := range sagaStates {
			out.Counts[st] = counts[st]
		}
		for _, p := range parked {
			out.NeedsAttention = append(out.NeedsAttention, sagaNeedsAttention{OrderID: p.OrderID, Since: p.Since, Reason: p.Reason})
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	for _, st := range sagaStates {
		fmt.Printf("%-16s %d\n", st, counts[st])
	}
	for _, p := range parked {
		fmt.Printf("needs attention: order %s since %s: %s\n", p.OrderID, p.Since.Format(time.RFC3339), p.Reason)
	}
	return nil
}

func sagaResolve(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "saga resolve", "saga resolve --order ID --as cancelled|confirmed --reason TEXT [--by NAME] [flags]\n\nSettles a saga parked as needs_attention (a refund that failed for good), after\nthe operator dealt with it outside (e.g. refunded by hand). Records who and why\nas a step of the saga's history. Changes the saga's state only.")
	var common cli.Common
	common.Register(fs)
	appSchema := appSchemaFlag(fs)
	order := fs.String("order", "", "the order id")
	as := fs.String("as", "", "the saga's final state: cancelled or confirmed")
	reason := fs.String("reason", "", "why (recorded)")
	by := fs.String("by", cli.CurrentUser(), "who resolves (recorded; default: the OS user)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *order == "" || *as == "" || *reason == "" {
		return cli.Usagef(fs, "--order, --as and --reason are required")
	}
	svc, pool, err := sagaService(ctx, common, *appSchema)
	if err != nil {
		return err
	}
	defer pool.Close()
	sg, err := svc.ResolveSaga(ctx, *order, *as, *reason, *by)
	if err != nil {
		return err
	}
	fmt.Printf("order %s: saga %s (resolved by %s: %s)\n", *order, sg.State, *by, *reason)
	return nil
}

// withPoolMaxConns sets pool_max_conns in a database URL (or key=value
// connection string) that does not set it.
func withPoolMaxConns(dsn string, n int32) string {
	if strings.Contains(dsn, "pool_max_conns") {
		return dsn
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return fmt.Sprintf("%s%spool_max_conns=%d", dsn, sep, n)
	}
	return fmt.Sprintf("%s pool_max_conns=%d", dsn, n)
}
