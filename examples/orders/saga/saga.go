// Package saga is the order service's saga consumer (`orders saga`): it
// reads the inventory's and the payments' events (aggregate types
// "inventory" and "payment") and takes the order's next step through
// ordersapi.Service.ApplySagaEvent, in the inbox transaction: confirm a
// paid order, cancel an order whose stock was rejected or whose payment
// failed (recording OrderCancelled, which makes inventory release the stock
// and payments refund a charge), or park the saga as needs_attention when
// a refund failed for good. docs/saga.md has the whole contract.
package saga

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/internal/natsloop"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/inbox"
)

// Defaults of Config.
const (
	DurableDefault       = "orders-saga"
	InboxConsumerDefault = "orders-saga"
	WorkersDefault       = 4
	AckWaitDefault       = 30 * time.Second
	RetryDelayDefault    = 100 * time.Millisecond
	RetryDelayMax        = 10 * time.Second
)

// Settings are the settings the example NATS consumers share.
type Settings = natsloop.Settings

// Config configures a Consumer.
type Config struct {
	// Settings are the NATS consumer's settings: Schema holds the outbox
	// and inbox tables; Durable is the durable consumers' name prefix.
	Settings
}

// Consumer applies the saga's events to the orders.
type Consumer struct {
	svc     *ordersapi.Service
	cfg     Config
	inbox   *inbox.Inbox
	applied atomic.Int64
	retried atomic.Int64
}

// New returns a consumer over the order service svc (its tables and
// outbox).
func New(pool *pgxpool.Pool, svc *ordersapi.Service, cfg Config) (*Consumer, error) {
	if pool == nil || svc == nil {
		return nil, errors.New("saga: New needs a pool and the order service")
	}
	cfg.Settings = natsloop.WithDefaults(cfg.Settings, Settings{Durable: DurableDefault, InboxConsumer: InboxConsumerDefault,
		Workers: WorkersDefault, AckWait: AckWaitDefault, RetryDelay: RetryDelayDefault})
	in, err := inbox.New(pool, inbox.Config{Consumer: cfg.InboxConsumer, Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	return &Consumer{svc: svc, cfg: cfg, inbox: in}, nil
}

// Handle applies one delivery through the inbox; a nil error settles it,
// else it is to be delivered again after the returned delay.
func (c *Consumer) Handle(ctx context.Context, msg outbox.Message, delivery int) (time.Duration, error) {
	out, err := c.inbox.Handle(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		return c.svc.ApplySagaEvent(ctx, tx, msg)
	})
	if err == nil && out == inbox.Early {
		err = natsloop.ErrEarly
	}
	if err != nil {
		c.retried.Add(1)
		return inbox.Backoff{Min: c.cfg.RetryDelay, Max: RetryDelayMax}.Delay(delivery), err
	}
	if out == inbox.Applied {
		c.applied.Add(1)
	}
	return 0, nil
}

// Applied counts the events applied.
func (c *Consumer) Applied() int64 { return c.applied.Load() }

// Run consumes from NATS JetStream until ctx ends.
func (c *Consumer) Run(ctx context.Context, js jetstream.JetStream) error {
	c.cfg.Logger.Info("saga consumer starting", slog.String("durable", c.cfg.Durable))
	return natsloop.Run(ctx, js, natsloop.Config{
		Stream: c.cfg.Stream, SubjectPrefix: c.cfg.SubjectPrefix, Durable: c.cfg.Durable,
		Description:    "example order saga (confirms or cancels orders on inventory and payment events)",
		AggregateTypes: []string{orderevents.InventoryAggregateType, orderevents.PaymentAggregateType},
		Workers:        c.cfg.Workers, AckWait: c.cfg.AckWait, Logger: c.cfg.Logger,
	}, c.Handle)
}
