package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/examples/orders/internal/natsloop"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/outboxnats"
)

// FilterSubject is the subject filter of the durable consumer.
func (c *Consumer) FilterSubject() string {
	return outboxnats.AggregateTypeFilter(c.cfg.SubjectPrefix, orderevents.AggregateType)
}

// ConsumerConfig is the JetStream configuration of the durable consumer:
// explicit acks, a bounded ack wait, unlimited redeliveries, every order
// event from the start of the stream.
func (c *Consumer) ConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.cfg.Durable,
		Description:   "example inventory consumer (reserves stock for order events)",
		FilterSubject: c.FilterSubject(),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.cfg.AckWait,
		MaxDeliver:    -1,
	}
}

// RunNATS creates (or updates) the durable consumer on js and processes
// messages with Workers goroutines until ctx ends; then it stops pulling,
// finishes the messages it holds and returns nil. While the stream does not
// exist yet (no relay has published) or the broker is unreachable, it waits
// and retries.
func (c *Consumer) RunNATS(ctx context.Context, js jetstream.JetStream) error {
	if js == nil {
		return errors.New("inventory: RunNATS needs a JetStream context")
	}
	c.log.Info("inventory consumer starting", slog.String("stream", c.cfg.Stream), slog.String("durable", c.cfg.Durable),
		slog.String("filter", c.FilterSubject()), slog.Int("workers", c.cfg.Workers))
	failures := 0
	for ctx.Err() == nil {
		cons, err := c.ensureConsumer(ctx, js)
		if err != nil {
			break // ctx ended
		}
		err = natsloop.Consume(ctx, cons, c.cfg.Workers, c.log, c.process)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			return fmt.Errorf("inventory: %w", err)
		}
		failures++
		d := natsloop.Backoff(failures, 250*time.Millisecond, 5*time.Second)
		c.log.Warn("message iterator ended; restarting", slog.Any("error", err), slog.Duration("retry_in", d))
		natsloop.Sleep(ctx, d)
	}
	c.log.Info("inventory consumer stopped", slog.Any("stats", c.Stats()))
	return nil
}

// ensureConsumer creates or updates the durable consumer, retrying until it
// succeeds or ctx ends.
func (c *Consumer) ensureConsumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cons, err := js.CreateOrUpdateConsumer(cctx, c.cfg.Stream, c.ConsumerConfig())
		cancel()
		if err == nil {
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		d := natsloop.Backoff(attempt, 100*time.Millisecond, 5*time.Second)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if attempt == 1 {
				c.log.Info("stream does not exist yet; waiting for the relay to create it", slog.String("stream", c.cfg.Stream))
			}
		} else {
			c.log.Warn("create consumer", slog.Any("error", err), slog.Duration("retry_in", d))
		}
		natsloop.Sleep(ctx, d)
	}
}

// process handles one delivery: decode, then deliver (the inbox), then
// ack, or nak with a delay for a redelivery.
func (c *Consumer) process(ctx context.Context, m jetstream.Msg) {
	c.delivered.Add(1)
	delivered := uint64(1)
	if md, err := m.Metadata(); err == nil {
		delivered = md.NumDelivered
	}
	msg, err := outboxnats.Decode(m.Headers(), m.Data())
	if err != nil {
		c.rejected.Add(1)
		c.log.Error("undecodable message terminated", slog.String("subject", m.Subject()), slog.Any("error", err))
		_ = m.TermWithReason("undecodable: " + err.Error())
		return
	}
	switch v, d := c.deliver(ctx, msg, int(delivered)); v {
	case again, dropAck:
		_ = m.NakWithDelay(d)
	case settle:
		if err := m.Ack(); err != nil {
			c.log.Warn("ack failed; the redelivery will be a duplicate", slog.String("event_id", msg.ID.String()), slog.Any("error", err))
		}
	}
}
