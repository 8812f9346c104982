package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/outboxnats"
)

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

// Run creates (or updates) the durable consumer and processes messages with
// Workers goroutines until ctx ends; then it stops pulling, finishes the
// messages it holds and returns nil. While the stream does not exist yet (no
// relay has published) or the broker is unreachable, it waits and retries.
func (c *Consumer) Run(ctx context.Context) error {
	if c.js == nil {
		return errors.New("inventory: Run needs a JetStream context")
	}
	c.log.Info("inventory consumer starting", slog.String("stream", c.cfg.Stream), slog.String("durable", c.cfg.Durable),
		slog.String("filter", c.FilterSubject()), slog.Int("workers", c.cfg.Workers))
	failures := 0
	for ctx.Err() == nil {
		cons, err := c.ensureConsumer(ctx)
		if err != nil {
			break // ctx ended
		}
		err = c.consume(ctx, cons)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			return fmt.Errorf("inventory: %w", err)
		}
		failures++
		d := retryDelay(failures, 250*time.Millisecond, 5*time.Second)
		c.log.Warn("message iterator ended; restarting", slog.Any("error", err), slog.Duration("retry_in", d))
		sleep(ctx, d)
	}
	c.log.Info("inventory consumer stopped", slog.Any("stats", c.Stats()))
	return nil
}

// ensureConsumer creates or updates the durable consumer, retrying until it
// succeeds or ctx ends.
func (c *Consumer) ensureConsumer(ctx context.Context) (jetstream.Consumer, error) {
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cons, err := c.js.CreateOrUpdateConsumer(cctx, c.cfg.Stream, c.ConsumerConfig())
		cancel()
		if err == nil {
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		d := retryDelay(attempt, 100*time.Millisecond, 5*time.Second)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if attempt == 1 {
				c.log.Info("stream does not exist yet; waiting for the relay to create it", slog.String("stream", c.cfg.Stream))
			}
		} else {
			c.log.Warn("create consumer", slog.Any("error", err), slog.Duration("retry_in", d))
		}
		sleep(ctx, d)
	}
}

// consume runs the workers over one message iterator until ctx ends (nil)
// or the iterator fails.
func (c *Consumer) consume(ctx context.Context, cons jetstream.Consumer) error {
	// A buffer of a few messages per worker keeps the workers busy; it is
	// far below what they process within the ack wait.
	it, err := cons.Messages(jetstream.PullMaxMessages(16 * c.cfg.Workers))
	if err != nil {
		return fmt.Errorf("pull messages: %w", err)
	}
	// On shutdown, stop pulling but hand out what is buffered: those
	// messages are processed and acked rather than left to time out.
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()
	defer it.Stop()

	work := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for m := range work {
				c.process(ctx, m)
			}
		})
	}
	defer func() { close(work); wg.Wait() }()
	for {
		m, err := it.Next()
		switch {
		case err == nil:
			work <- m
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			if ctx.Err() != nil {
				return nil
			}
			return err
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			// The broker is unreachable; the iterator recovers by itself.
			c.log.Warn("no heartbeat from the broker; waiting", slog.Any("error", err))
		default:
			c.log.Warn("pull messages", slog.Any("error", err))
		}
	}
}

// process handles one delivery: decode, apply through the inbox, then ack,
// or nak with a delay for a redelivery.
func (c *Consumer) process(ctx context.Context, m jetstream.Msg) {
	c.delivered.Add(1)
	// A message being processed is finished even when ctx ends, within the
	// ack wait (after which it is redelivered anyway).
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.AckWait)
	defer cancel()
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
	out, err := c.Handle(hctx, msg)
	if err != nil {
		d := retryDelay(int(delivered), c.cfg.RetryDelay, RetryDelayMax)
		c.log.Warn("apply event failed; redelivering", slog.String("event_id", msg.ID.String()),
			slog.String("order_id", msg.AggregateID), slog.Int64("sequence", msg.Sequence),
			slog.Uint64("delivery", delivered), slog.Duration("retry_in", d), slog.Any("error", err))
		_ = m.NakWithDelay(d)
		return
	}
	if out == inbox.Early {
		// An earlier event of this order is not applied yet: let it arrive.
		_ = m.NakWithDelay(retryDelay(int(delivered), c.cfg.EarlyDelay, 10*time.Second))
		return
	}
	if out == inbox.Duplicate {
		// Worth a line: a duplicate means a failure upstream (a lost ack, a
		// relay that crashed between the broker's ack and its mark).
		c.log.Info("duplicate delivery suppressed: already applied", slog.String("event_id", msg.ID.String()),
			slog.String("order_id", msg.AggregateID), slog.Int64("sequence", msg.Sequence), slog.Uint64("delivery", delivered))
	}
	if err := failpoint.Hit(FailpointAfterCommitBeforeAck); err != nil {
		// As if the ack were lost: the redelivery will be a duplicate.
		_ = m.NakWithDelay(c.cfg.EarlyDelay)
		return
	}
	if err := m.Ack(); err != nil {
		c.log.Warn("ack failed; the redelivery will be a duplicate", slog.String("event_id", msg.ID.String()), slog.Any("error", err))
	}
}

// retryDelay doubles base for each attempt after the first, up to max.
func retryDelay(attempt int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
