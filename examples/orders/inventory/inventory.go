// Package inventory is the example inventory consumer: it reserves stock for
// OrderCreated events and releases it for OrderCancelled events, reading the
// order events from the destination the relay publishes to: NATS JetStream
// through a durable pull consumer (consume_nats.go), Kafka through a
// consumer group (consume_kafka.go), a RabbitMQ queue (consume_amqp.go), or
// an HTTP webhook the relay posts to and the consumer serves
// (consume_webhook.go). [Consumer.Run] picks the transport from the
// destination URL.
//
// Every delivery, whatever its transport, goes through one code path
// (deliver, then inbox.Inbox.Handle), so the stock change commits in one
// local transaction with the inbox rows: a redelivered event is recognised
// as a duplicate and changes nothing (invariant I4), and an event that
// arrives before an earlier event of the same order is refused as early and
// delivered again later (invariant I5). A message is acknowledged (NATS) or
// its offset committed (Kafka) only after that transaction committed; the
// failpoint "consumer/after-commit-before-ack" sits between the two.
package inventory

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/internal/natsloop"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersdb"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// Defaults for Config.
const (
	DurableDefault       = "inventory"
	InboxConsumerDefault = "inventory"
	WorkersDefault       = 4
	AckWaitDefault       = 30 * time.Second
	EarlyDelayDefault    = 100 * time.Millisecond
	RetryDelayDefault    = 500 * time.Millisecond
	RetryDelayMax        = 30 * time.Second
	// SessionTimeoutDefault is short (Kafka's clients default to 45s) so
	// that a crashed consumer's partitions move to another soon.
	SessionTimeoutDefault = 10 * time.Second
)

// FailpointAfterCommitBeforeAck fires after the inbox transaction committed
// and before the message is acknowledged (NATS) or its offset committed
// (Kafka). An injected error skips the ack or the commit, as a crash there
// would: NATS redelivers the message; the Kafka consumer leaves its group
// without committing and rejoins, so the records come again from the last
// committed offset.
const FailpointAfterCommitBeforeAck = "consumer/after-commit-before-ack"

// Settings are the settings the example NATS consumers share.
type Settings = natsloop.Settings

// Config configures a Consumer.
type Config struct {
	// Settings are the consumer's settings: Schema holds the inbox tables
	// (and the outbox of SagaEvents); Durable also names the Kafka consumer
	// group and the RabbitMQ queue AMQPQueue(exchange, Durable); Workers
	// counts messages (NATS) or partitions (Kafka) processed at once; half
	// of AckWait (1s to 10s) is the AMQP heartbeat.
	Settings
	// AppSchema holds the inventory tables. Defaults to Schema.
	AppSchema string
	// SessionTimeout is how long the Kafka group waits for a silent member
	// before it hands the member's partitions to another; a rebalance waits
	// twice as long for the members to rejoin. Defaults to
	// SessionTimeoutDefault.
	SessionTimeout time.Duration
	// EarlyDelay is the first redelivery delay of an event that arrived
	// before an earlier event of its order was applied; it grows with the
	// deliveries up to inbox.RedeliveryDelayMax (inbox.Backoff). Defaults to
	// EarlyDelayDefault.
	EarlyDelay time.Duration
	// AMQPTLS is the TLS configuration of an amqps:// broker (RunAMQP);
	// nil verifies against the system's roots. Run sets it from the
	// destination URL's ca_file, cert_file and key_file.
	AMQPTLS *tls.Config
	// SagaEvents makes the consumer record the saga's StockReserved or
	// StockRejected (aggregate type orderevents.InventoryAggregateType) for
	// each OrderCreated, through the outbox in Schema, in the inbox
	// transaction that reserves the stock. Off, it records no events.
	SagaEvents bool
	// TracerProvider receives the inbox's CONSUMER span of each delivery
	// (and the webhook receiver's), continuing the trace of the order
	// request, and a "reserve stock" or "release stock" span inside it. Nil
	// means otel.GetTracerProvider(), a no-op unless the application set
	// one.
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() Config {
	c.Settings = natsloop.WithDefaults(c.Settings, Settings{Durable: DurableDefault, InboxConsumer: InboxConsumerDefault,
		Workers: WorkersDefault, AckWait: AckWaitDefault, RetryDelay: RetryDelayDefault})
	if c.AppSchema == "" {
		c.AppSchema = c.Schema
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = SessionTimeoutDefault
	}
	if c.EarlyDelay <= 0 {
		c.EarlyDelay = EarlyDelayDefault
	}
	return c
}

// Stats are the consumer's running totals.
type Stats struct {
	// Delivered counts messages received (including redeliveries).
	Delivered int64
	// Applied counts events whose effect committed.
	Applied int64
	// Duplicates counts deliveries of events applied before (acked, nothing
	// changed).
	Duplicates int64
	// Early counts deliveries refused because an earlier event of the order
	// was not applied yet (redelivered later).
	Early int64
	// Errors counts deliveries that failed (redelivered later).
	Errors int64
	// Rejected counts messages that could not be decoded (terminated).
	Rejected int64
	// Anomalies counts cancellations that found no reservation to release;
	// with the inbox's ordering it stays 0.
	Anomalies int64
	// StockRejected counts orders rejected for want of stock on hand.
	StockRejected int64
}

// Consumer reserves and releases stock for order events.
type Consumer struct {
	pool  *pgxpool.Pool
	cfg   Config
	inbox *inbox.Inbox
	log   *slog.Logger
	q     queries
	trace trace.Tracer
	// writer records the saga events (Config.SagaEvents), else nil.
	writer *outbox.Writer

	delivered, applied, duplicates, early, errs, rejected, anomalies, stockRejected atomic.Int64
	// ackDropped holds the event ids whose ack the failpoint dropped, so
	// that their duplicate's log line says an injected fault caused it.
	ackDropped sync.Map
}

type queries struct {
	reserve, addStock, release, lockStock, subStock, overdrawn, reject, wasRejected string
}

// New returns a consumer. Run it on a destination with Run (or RunNATS,
// RunKafka), or hand it events with Handle.
func New(pool *pgxpool.Pool, cfg Config) (*Consumer, error) {
	if pool == nil {
		return nil, errors.New("inventory: New needs a pool")
	}
	cfg = cfg.withDefaults()
	app, err := pgident.NewSchema(cfg.AppSchema)
	if err != nil {
		return nil, err
	}
	in, err := inbox.New(pool, inbox.Config{Consumer: cfg.InboxConsumer, Schema: cfg.Schema, TracerProvider: cfg.TracerProvider})
	if err != nil {
		return nil, err
	}
	var w *outbox.Writer
	if cfg.SagaEvents {
		if w, err = outbox.NewWriter(outbox.WriterConfig{Schema: cfg.Schema}); err != nil {
			return nil, err
		}
	}
	stock, res := app.Table("inventory_stock"), app.Table("inventory_reservations")
	return &Consumer{
		pool: pool, cfg: cfg, inbox: in, log: cfg.Logger, trace: tracer(cfg.TracerProvider), writer: w,
		q: queries{
			overdrawn: `SELECT sku, reserved, on_hand FROM ` + stock + ` WHERE sku = ANY($1) AND on_hand IS NOT NULL AND reserved > on_hand ORDER BY sku`,
			reject: `INSERT INTO ` + res + ` (order_id, sku, quantity, status, event_id)
SELECT $1, sku, quantity, 'rejected', $4 FROM unnest($2::text[], $3::int[]) AS i(sku, quantity)`,
			wasRejected: `SELECT EXISTS (SELECT 1 FROM ` + res + ` WHERE order_id = $1 AND status = 'rejected')`,
			reserve: `INSERT INTO ` + res + ` (order_id, sku, quantity, status, event_id)
SELECT $1, sku, quantity, 'reserved', $4 FROM unnest($2::text[], $3::int[]) AS i(sku, quantity)`,
			// SKUs are locked in a fixed order, so concurrent orders cannot deadlock.
			addStock: `INSERT INTO ` + stock + ` AS s (sku, reserved)
SELECT sku, quantity FROM unnest($1::text[], $2::int[]) AS i(sku, quantity) ORDER BY sku
ON CONFLICT (sku) DO UPDATE SET reserved = s.reserved + EXCLUDED.reserved, updated_at = now()`,
			release: `UPDATE ` + res + ` SET status = 'released', released_at = now()
WHERE order_id = $1 AND status = 'reserved' RETURNING sku, quantity`,
			lockStock: `SELECT sku FROM ` + stock + ` WHERE sku = ANY($1) ORDER BY sku FOR UPDATE`,
			subStock: `UPDATE ` + stock + ` AS s SET reserved = s.reserved - i.quantity, updated_at = now()
FROM unnest($1::text[], $2::int[]) AS i(sku, quantity)
WHERE s.sku = i.sku`,
		},
	}, nil
}

// Migrate applies the outbox migrations (for the inbox tables) to Schema and
// the inventory tables' migrations to AppSchema.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema, appSchema string) error {
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if appSchema == "" {
		appSchema = schema
	}
	_, err := ordersdb.Migrate(ctx, pool, appSchema, ordersdb.Inventory)
	return err
}

// Inbox is the inbox the consumer deduplicates and orders with.
func (c *Consumer) Inbox() *inbox.Inbox { return c.inbox }

// Stats returns the consumer's running totals.
func (c *Consumer) Stats() Stats {
	return Stats{Delivered: c.delivered.Load(), Applied: c.applied.Load(), Duplicates: c.duplicates.Load(),
		Early: c.early.Load(), Errors: c.errs.Load(), Rejected: c.rejected.Load(), Anomalies: c.anomalies.Load(),
		StockRejected: c.stockRejected.Load()}
}

// Handle applies one event through the inbox and counts the outcome.
func (c *Consumer) Handle(ctx context.Context, msg outbox.Message) (inbox.Outcome, error) {
	out, err := c.inbox.Handle(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		return c.apply(ctx, tx, msg)
	})
	switch {
	case err != nil:
		c.errs.Add(1)
	case out == inbox.Applied:
		c.applied.Add(1)
	case out == inbox.Duplicate:
		c.duplicates.Add(1)
	case out == inbox.Early:
		c.early.Add(1)
	}
	return out, err
}

// apply is the business effect of one event, inside the inbox transaction
// (and the inbox's span, which ctx carries).
func (c *Consumer) apply(ctx context.Context, tx pgx.Tx, msg outbox.Message) (err error) {
	ctx, span := c.startEffect(ctx, msg)
	defer func() { endEffect(span, err) }()
	switch msg.Type {
	case orderevents.OrderCreated:
		var p orderevents.OrderCreatedPayload
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return fmt.Errorf("decode %s payload: %w", msg.Type, err)
		}
		skus := make([]string, len(p.Items))
		qtys := make([]int32, len(p.Items))
		for i, it := range p.Items {
			skus[i], qtys[i] = it.SKU, int32(it.Quantity)
		}
		// The stock rows are locked (in SKU order) by addStock; a SKU
		// overdrawn past its on_hand rejects the whole order.
		if _, err := tx.Exec(ctx, c.q.addStock, skus, qtys); err != nil {
			return fmt.Errorf("reserve stock: %w", err)
		}
		short, err := c.overdrawn(ctx, tx, skus)
		if err != nil {
			return err
		}
		if short != "" {
			if _, err := tx.Exec(ctx, c.q.subStock, skus, qtys); err != nil {
				return fmt.Errorf("reject stock: %w", err)
			}
			if _, err := tx.Exec(ctx, c.q.reject, msg.AggregateID, skus, qtys, msg.ID); err != nil {
				return fmt.Errorf("reject: %w", err)
			}
			c.stockRejected.Add(1)
			return c.record(ctx, tx, orderevents.StockRejected, orderevents.StockPayload{
				OrderID: msg.AggregateID, Items: p.Items, TotalCents: p.TotalCents, Reason: short})
		}
		if _, err := tx.Exec(ctx, c.q.reserve, msg.AggregateID, skus, qtys, msg.ID); err != nil {
			return fmt.Errorf("reserve: %w", err)
		}
		return c.record(ctx, tx, orderevents.StockReserved, orderevents.StockPayload{
			OrderID: msg.AggregateID, Items: p.Items, TotalCents: p.TotalCents})
	case orderevents.OrderCancelled:
		rows, err := tx.Query(ctx, c.q.release, msg.AggregateID)
		if err != nil {
			return fmt.Errorf("release: %w", err)
		}
		var skus []string
		var qtys []int32
		var sku string
		var qty int32
		if _, err := pgx.ForEachRow(rows, []any{&sku, &qty}, func() error {
			skus, qtys = append(skus, sku), append(qtys, qty)
			return nil
		}); err != nil {
			return fmt.Errorf("release: %w", err)
		}
		if len(skus) == 0 {
			var rejected bool
			if err := tx.QueryRow(ctx, c.q.wasRejected, msg.AggregateID).Scan(&rejected); err != nil {
				return fmt.Errorf("release: %w", err)
			}
			if rejected {
				return nil // nothing was reserved
			}
			// The inbox applies an order's events in sequence, so the
			// reservation of its OrderCreated must be here.
			c.anomalies.Add(1)
			c.log.Error("cancellation found no reservation to release", slog.String("order_id", msg.AggregateID),
				slog.Int64("sequence", msg.Sequence))
			return nil
		}
		// Lock the SKUs' rows in a fixed order first (an UPDATE ... FROM
		// may visit them in any order), so concurrent orders cannot deadlock.
		if _, err := tx.Exec(ctx, c.q.lockStock, skus); err != nil {
			return fmt.Errorf("release stock: %w", err)
		}
		if _, err := tx.Exec(ctx, c.q.subStock, skus, qtys); err != nil {
			return fmt.Errorf("release stock: %w", err)
		}
	default:
		// An event this consumer does not care about still advances the
		// order's high-water mark, or the order's later events would wait
		// for it forever.
	}
	return nil
}

// overdrawn names the first SKU whose reservations exceed its stock on
// hand, as a reason ("" when none does).
func (c *Consumer) overdrawn(ctx context.Context, tx pgx.Tx, skus []string) (string, error) {
	var sku string
	var reserved, onHand int64
	err := tx.QueryRow(ctx, c.q.overdrawn, skus).Scan(&sku, &reserved, &onHand)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("check stock on hand: %w", err)
	}
	return fmt.Sprintf("%s: %d on hand, %d asked for in all", sku, onHand, reserved), nil
}

// record writes a saga event about the order in the inbox transaction, when
// Config.SagaEvents is on.
func (c *Consumer) record(ctx context.Context, tx pgx.Tx, typ string, payload orderevents.StockPayload) error {
	if c.writer == nil {
		return nil
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	_, err = c.writer.InsertTx(ctx, tx, outbox.Event{
		AggregateType: orderevents.InventoryAggregateType, AggregateID: payload.OrderID, Type: typ, Payload: b})
	if err != nil {
		return fmt.Errorf("record %s: %w", typ, err)
	}
	return nil
}
