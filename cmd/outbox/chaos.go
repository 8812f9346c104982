package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/pgoutbox/outbox/internal/chaos"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/internal/pgcluster"
)

const chaosUsage = `chaos --duration D --seed S [flags]

Runs the example order system as processes: the order API ("orders api"), --relays
relays ("outbox relay", this binary) and --consumers inventory consumers ("orders
inventory", sharing one durable consumer or consumer group), on a fresh schema of
DATABASE_URL and the --destination: "nats" (the default: a NATS server of its own,
nats-server or an embedded one), "kafka" (franz-go's in-process Kafka-protocol
cluster, kfake, in this process on a free port, persisted to the run's directory
so that it can be restarted; the processes speak the Kafka protocol to it as to
any Kafka), "amqp" (a RabbitMQ node of its own on free ports, rabbitmq-server),
"webhook" (the relays POST each event to the one inventory consumer, which serves
the webhook on a free port, signed with a secret of the run's own passed in
OUTBOX_WEBHOOK_SECRET; no broker in between), or the URL of an external broker
(nats://host:port, kafka://host:port, amqp://user:password@host:port/), on which
the run makes a stream, topic or exchange of its own (on RabbitMQ with the
consumers' queue and a witness queue that only the checker reads, bound before any
relay starts), or http://host:port/path for the consumer to serve. For
--duration it drives commands over HTTP (creates, cancellations, rollbacks, retries
with the same Idempotency-Key) and injects faults at the seed's times: SIGKILLs,
restarts with a failpoint armed (OUTBOX_FAILPOINTS), relays paused past their
lease, broker restarts. Broker restarts need a broker the run can restart without
losing data, its own NATS server, kfake cluster or RabbitMQ node: on
external brokers they are left out, and on a webhook they do not apply (its endpoint is the
consumer, killed and restarted like any process); the run says so. A webhook runs
one consumer process whatever --consumers says, as it has one endpoint. Then it lets everything recover and checks I1-I5
and request idempotency on PostgreSQL and the destination. It prints one line per
figure and per invariant and exits non-zero on any violation. The same seed gives
the same schedule of faults (--print-schedule lists it).

--mode cdc runs the relays with 'outbox relay --mode cdc' (one streams the slot,
the others stand by; each runs the polling safety net) on a private PostgreSQL
cluster with wal_level=logical that the run starts and removes (it needs
PostgreSQL's server binaries, initdb and pg_ctl; --database-url is not used), and
adds the CDC stream's boundaries (cdc/before-publish, cdc/before-confirm) to the
relays' failpoints, and to the faults, in turn about every 12s, PostgreSQL crashes
(immediate shutdown, down 1-3s) and slot invalidations (the cluster runs with
max_slot_wal_keep_size=1MB; two WAL switches and a checkpoint invalidate the slot).

--saga adds the order saga (NATS only): the payment provider ("orders provider",
--provider-mode), the payments consumer ("orders payments") and the saga consumer
("orders saga run"); inventory records its saga events. Its faults: kills of the
three (a provider crash), the payments consumer killed or failing between the
provider call and its record (sideeffect/after-call-before-record) or before the
call, and provider faults set through its control listener for a few seconds:
timeouts after commit, dropped responses, 500s after commit. It then also waits
for every saga to settle and checks I6 (no order charged twice, from the
provider's ledger; a figure in mode neither) and I7 (every order confirmed,
cancelled with nothing charged, or parked with a reason).`

func runChaos(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("outbox", "chaos", chaosUsage)
	var cfg chaos.Config
	cli.DatabaseURLFlag(fs, &cfg.DatabaseURL)
	fs.DurationVar(&cfg.Duration, "duration", time.Minute, "how long to drive commands and inject faults")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the fault schedule and the command mix (0: random, printed)")
	ordersBin := fs.String("orders-bin", cli.Env("OUTBOX_CHAOS_ORDERS_BIN", ""), "the orders binary (env OUTBOX_CHAOS_ORDERS_BIN; default: 'orders' beside this binary, else built with the go tool from this module)")
	fs.StringVar(&cfg.Destination, "destination", cli.Env("OUTBOX_CHAOS_DESTINATION", "nats"), "nats, kafka, amqp, webhook, or a URL: nats://host:port, kafka://host:port, amqp://user:password@host:port/, http://host:port/path (env OUTBOX_CHAOS_DESTINATION)")
	cli.RedactDefault(fs, "destination", destination.Redact)
	natsServer := fs.String("nats-server", cli.Env("OUTBOX_CHAOS_NATS_SERVER", ""), "nats-server executable to run as the broker, or 'embedded' (default: nats-server on PATH or /usr/sbin/nats-server, else embedded)")
	fs.IntVar(&cfg.Relays, "relays", 2, "relay processes")
	fs.IntVar(&cfg.Consumers, "consumers", 2, "inventory consumer processes")
	fs.IntVar(&cfg.Clients, "clients", 4, "concurrent HTTP clients")
	fs.Float64Var(&cfg.Rate, "rate", 30, "commands per second, in total")
	fs.DurationVar(&cfg.Every, "fault-interval", 2*time.Second, "mean time between two faults")
	fs.DurationVar(&cfg.Lease, "lease", 2*time.Second, "the relays' lease")
	fs.DurationVar(&cfg.RecoverTimeout, "recover-timeout", 3*time.Minute, "how long to wait, after the faults, for everything to be published and applied")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the schema, the broker's storage and the logs")
	fs.BoolVar(&cfg.Verbose, "verbose", false, "copy the processes' output to stderr")
	fs.BoolVar(&cfg.Saga, "saga", false, "also run the order saga (payment provider, payments and saga consumers; NATS only): kill them, kill payments between the provider call and its record, inject provider timeouts after commit, dropped responses and 500s, and check I6 and I7")
	fs.StringVar(&cfg.ProviderMode, "provider-mode", "idempotent", "with --saga: the provider's mode, idempotent or queryable (I6 checked) or neither (an unknown outcome parked for an operator, never called blindly again; duplicate charges reported as a figure)")
	printSchedule := fs.Bool("print-schedule", false, "print the fault schedule of --seed and --duration, and exit")
	mode := fs.String("mode", cli.Env("OUTBOX_CHAOS_MODE", "polling"), "relay mode: polling, or cdc (on a private cluster with wal_level=logical; env OUTBOX_CHAOS_MODE)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	switch {
	case cfg.Duration < 5*time.Second:
		return fmt.Errorf("--duration %s: at least 5s", cfg.Duration)
	case cfg.Relays < 1 || cfg.Consumers < 1 || cfg.Clients < 1 || cfg.Rate <= 0:
		return errors.New("--relays, --consumers, --clients and --rate must be positive")
	case *mode != "polling" && *mode != "cdc":
		return cli.Usagef(fs, "--mode %q: want polling or cdc", *mode)
	}
	cfg.CDC = *mode == "cdc"
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()%1_000_000 + 1
	}
	if *printSchedule {
		sys := chaos.NewSystem(chaos.SystemConfig{Relays: cfg.Relays, Consumers: cfg.Consumers, Saga: cfg.Saga})
		sc := cfg.ScheduleConfig(sys.Names(), cfg.Destination != "nats" && cfg.Destination != "kafka" && cfg.Destination != "amqp")
		sc.Postgres = cfg.CDC // the private cluster of a real run
		s := chaos.NewSchedule(sc)
		fmt.Printf("seed %d, %s: schedule %s, %d faults\n%s", cfg.Seed, cfg.Duration, s.Digest(), len(s), s)
		return nil
	}
	switch *natsServer {
	case "embedded":
	case "":
		cfg.NATSServer = chaos.NATSServerPath()
	default:
		cfg.NATSServer = *natsServer
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	cfg.Bins.Outbox = self
	if cfg.Bins.Orders, err = findOrders(ctx, *ordersBin, self); err != nil {
		return err
	}
	cfg.Out, cfg.Logs = os.Stdout, os.Stderr
	if cfg.CDC {
		cluster, err := pgcluster.Start(pgcluster.Config{Settings: map[string]string{
			"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "20",
			// Tiny, so that the slot faults invalidate the slot.
			"max_slot_wal_keep_size": "1MB"}})
		if err != nil {
			return fmt.Errorf("--mode cdc needs a private PostgreSQL cluster: %w", err)
		}
		defer func() { _ = cluster.Close() }()
		cfg.DatabaseURL, cfg.Postgres = cluster.URL(""), cluster
		fmt.Printf("private PostgreSQL cluster with wal_level=logical on port %d\n", cluster.Port())
	}
	_, err = chaos.Run(ctx, cfg)
	return err
}

// findOrders returns the orders binary: the flag's, the one beside this
// binary, or one built from the module the working directory is in.
func findOrders(ctx context.Context, flagged, self string) (string, error) {
	if flagged != "" {
		if _, err := os.Stat(flagged); err != nil {
			return "", fmt.Errorf("--orders-bin: %w", err)
		}
		return flagged, nil
	}
	beside := filepath.Join(filepath.Dir(self), "orders")
	if _, err := os.Stat(beside); err == nil {
		return beside, nil
	}
	wd, _ := os.Getwd()
	root, err := chaos.ModuleRoot(wd)
	if err != nil {
		return "", fmt.Errorf("no orders binary: pass --orders-bin (or run from the module to have it built): %w", err)
	}
	dir, err := os.MkdirTemp("", "outbox-chaos-orders-")
	if err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "building the orders binary from %s\n", root)
	bins, err := chaos.Build(ctx, root, dir, false)
	if err != nil {
		return "", err
	}
	return bins.Orders, nil
}
