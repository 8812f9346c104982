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

	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/internal/otelexport"
)

func logger() *slog.Logger { return slog.New(slog.NewTextHandler(os.Stderr, nil)) }

// appSchemaFlag adds --app-schema: where the business tables live.
func appSchemaFlag(fs *flag.FlagSet) *string {
	return fs.String("app-schema", cli.Env("ORDERS_APP_SCHEMA", ""),
		"PostgreSQL schema of the example's business tables (env ORDERS_APP_SCHEMA; default: the --schema value)")
}

func runAPI(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "api", "api [flags]\n\nServes POST /orders, GET /orders/{id} and POST /orders/{id}/cancel. Each command\nwrites its rows and its event in one transaction. With --relay, a relay publishing\nthe events to --destination runs in the same process. Stops on SIGINT/SIGTERM.\nOTEL_TRACES_EXPORTER=console prints the spans (request, publish) as JSON lines on stdout.")
	var common cli.Common
	var dest destination.Options
	common.Register(fs)
	dest.Register(fs)
	appSchema := appSchemaFlag(fs)
	listen := fs.String("listen", cli.Env("ORDERS_LISTEN", "127.0.0.1:8080"), "address to serve HTTP on (env ORDERS_LISTEN)")
	withRelay := fs.Bool("relay", false, "also run a relay in this process, publishing to --destination")
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "how long to finish in-flight requests on shutdown")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	log := logger()
	pool, err := common.Connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	tp, stopTraces, err := otelexport.FromEnv(ctx, "orders-api", os.Stdout)
	if err != nil {
		return err
	}
	defer otelexport.Stop(ctx, stopTraces)
	svc, err := ordersapi.New(pool, ordersapi.Config{Schema: common.Schema, AppSchema: *appSchema, Logger: log, TracerProvider: tp})
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil {
		return err
	}
	var relay *outbox.Relay
	if *withRelay {
		pub, closePub, err := destination.Open(ctx, dest)
		if err != nil {
			return err
		}
		defer closePub()
		relay, err = outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, Schema: common.Schema, Logger: log, TracerProvider: tp})
		if err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 10 * time.Second}
	log.Info("order API listening", slog.String("addr", ln.Addr().String()), slog.String("schema", common.Schema), slog.Bool("relay", relay != nil))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
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
	if relay != nil {
		g.Go(func() error { return relay.Run(gctx) })
	}
	err = g.Wait()
	log.Info("order API stopped", slog.Any("stats", svc.Stats()))
	return err
}

func runInventory(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("orders", "inventory", "inventory [flags]\n\nConsumes the order events from the destination (--destination): from NATS JetStream\nwith a durable pull consumer, from Kafka as a consumer group (the --durable name),\ncommitting offsets only after the inbox transaction committed, or from RabbitMQ\n(amqp://) through the queue \"<exchange>.<durable>\", which it declares and binds,\nacking only after the inbox transaction committed; or, for an http:// webhook URL,\nserves that URL (its host:port and path) and answers the relay's POSTs (secret in\nOUTBOX_WEBHOOK_SECRET): 204 once the inbox transaction committed. It reserves or\nreleases stock, each event applied once and in order per order through the inbox.\nStops on SIGINT/SIGTERM after finishing the messages it holds.\nOTEL_TRACES_EXPORTER=console prints the spans (inbox, stock change) as JSON lines on stdout.")
	var common cli.Common
	var dest destination.Options
	common.Register(fs)
	fs.StringVar(&dest.URL, "destination", cli.Env("OUTBOX_DESTINATION", ""), "where the events are: "+inventory.Schemes+" (env OUTBOX_DESTINATION)")
	cli.RedactDefault(fs, "destination", destination.Redact)
	dest.RegisterNATS(fs)
	appSchema := appSchemaFlag(fs)
	var cfg inventory.Config
	fs.StringVar(&cfg.Durable, "durable", cli.Env("INVENTORY_DURABLE", inventory.DurableDefault), "JetStream durable consumer name, Kafka consumer group, or RabbitMQ queue <exchange>.<durable> (env INVENTORY_DURABLE)")
	fs.IntVar(&cfg.Workers, "workers", inventory.WorkersDefault, "messages processed at once (NATS), or partitions (Kafka)")
	fs.DurationVar(&cfg.AckWait, "ack-wait", inventory.AckWaitDefault, "how long JetStream waits for an ack before redelivering (and the bound on handling one event)")
	fs.DurationVar(&cfg.SessionTimeout, "session-timeout", inventory.SessionTimeoutDefault, "Kafka: how long the group waits for a silent member before moving its partitions")
	fs.BoolVar(&cfg.SagaEvents, "saga-events", cli.Env("INVENTORY_SAGA_EVENTS", "") == "true", "record StockReserved/StockRejected through the outbox for the order saga (env INVENTORY_SAGA_EVENTS=true)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if dest.URL == "" {
		return errors.New("no destination: set --destination or OUTBOX_DESTINATION (e.g. nats://127.0.0.1:4222, kafka://127.0.0.1:9092 or http://127.0.0.1:8081/events)")
	}
	log := logger()
	pool, err := common.Connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := inventory.Migrate(ctx, pool, common.Schema, *appSchema); err != nil {
		return err
	}
	cfg.Schema, cfg.AppSchema = common.Schema, *appSchema
	cfg.Stream, cfg.SubjectPrefix = dest.NATSStream, dest.NATSSubjectPrefix
	cfg.Logger = log
	tp, stopTraces, err := otelexport.FromEnv(ctx, "orders-inventory", os.Stdout)
	if err != nil {
		return err
	}
	defer otelexport.Stop(ctx, stopTraces)
	cfg.TracerProvider = tp
	cons, err := inventory.New(pool, cfg)
	if err != nil {
		return err
	}
	return cons.Run(ctx, dest.URL)
}
