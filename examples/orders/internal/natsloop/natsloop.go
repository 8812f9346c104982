// Package natsloop is the example consumers' shared JetStream code. Run is
// the saga consumers' loop (payments and the order service's saga
// consumer): a durable pull consumer per aggregate type, workers that hand
// each decoded event to a handler, and an ack only once the handler says
// the event is settled; otherwise a nak with the handler's delay, so
// JetStream delivers it again. The inventory consumer, which keeps its own
// durable consumer and verdicts, shares Consume (the workers over one
// message iterator), Backoff and Sleep (for all its transports). Settings
// are the settings (and the defaulting) the three consumers share.
package natsloop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pgoutbox/outbox/internal/backoff"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxnats"
)

// Config configures Run.
type Config struct {
	Stream, SubjectPrefix, Durable, Description string
	// AggregateTypes are the aggregate types consumed.
	AggregateTypes []string
	Workers        int
	AckWait        time.Duration
	Logger         *slog.Logger
}

// Handler handles one delivery (delivery counts from 1): nil settles it (ack);
// an error asks for a redelivery after retry (an inbox.Backoff's delay).
// ErrEarly (wrapped or not) says the inbox found the event early.
type Handler func(ctx context.Context, msg outbox.Message, delivery int) (retry time.Duration, err error)

// ErrEarly is a Handler's error for an event the inbox found early (an
// earlier event of its aggregate is not applied yet): redelivered like a
// failure, logged at debug level only (the inbox_early_total metric counts
// them), since a redelivery that overtook its predecessor is no fault.
var ErrEarly = errors.New("an earlier event of the aggregate is not applied yet")

// Run consumes until ctx ends, recreating the message iterators after a
// failure and waiting for the stream while it does not exist. Each
// aggregate type has a durable consumer of its own, "<Durable>-<type>"
// (a consumer with several filter subjects needs nats-server 2.10).
func Run(ctx context.Context, js jetstream.JetStream, cfg Config, h Handler) error {
	errs := make(chan error, len(cfg.AggregateTypes))
	for _, t := range cfg.AggregateTypes {
		go func() { errs <- runOne(ctx, js, cfg, t, h) }()
	}
	var first error
	for range cfg.AggregateTypes {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func runOne(ctx context.Context, js jetstream.JetStream, cfg Config, aggregateType string, h Handler) error {
	cc := jetstream.ConsumerConfig{
		Durable: cfg.Durable + "-" + aggregateType, Description: cfg.Description,
		FilterSubject: outboxnats.AggregateTypeFilter(cfg.SubjectPrefix, aggregateType),
		DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: cfg.AckWait, MaxDeliver: -1,
	}
	log := cfg.Logger
	for attempt := 1; ctx.Err() == nil; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cons, err := js.CreateOrUpdateConsumer(cctx, cfg.Stream, cc)
		cancel()
		if err != nil {
			if !errors.Is(err, jetstream.ErrStreamNotFound) && ctx.Err() == nil {
				log.Warn("create consumer", slog.Any("error", err))
			}
			Sleep(ctx, Backoff(attempt, 100*time.Millisecond, 5*time.Second))
			continue
		}
		err = Consume(ctx, cons, cfg.Workers, log, func(ctx context.Context, m jetstream.Msg) { process(ctx, m, cfg, h) })
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			return fmt.Errorf("%s: %w", cfg.Durable, err)
		}
		log.Warn("message iterator ended; restarting", slog.Any("error", err))
		Sleep(ctx, Backoff(attempt, 250*time.Millisecond, 5*time.Second))
	}
	return nil
}

// Consume hands the messages of one iterator over cons to workers
// goroutines, each calling process for one message, until ctx ends (nil) or
// the iterator fails. It pulls a few messages per worker, far below what
// they process within the ack wait. When ctx ends it stops pulling but
// hands out what is buffered, so those messages are processed and acked
// rather than left to time out, and returns once the workers are done.
func Consume(ctx context.Context, cons jetstream.Consumer, workers int, log *slog.Logger, process func(context.Context, jetstream.Msg)) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(16 * workers))
	if err != nil {
		return fmt.Errorf("pull messages: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()
	defer it.Stop()
	work := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for m := range work {
				process(ctx, m)
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
			log.Warn("no heartbeat from the broker; waiting", slog.Any("error", err))
		default:
			log.Warn("pull messages", slog.Any("error", err))
		}
	}
}

func process(ctx context.Context, m jetstream.Msg, cfg Config, h Handler) {
	delivered := 1
	if md, err := m.Metadata(); err == nil {
		delivered = int(md.NumDelivered)
	}
	msg, err := outboxnats.Decode(m.Headers(), m.Data())
	if err != nil {
		cfg.Logger.Error("undecodable message terminated", slog.String("subject", m.Subject()), slog.Any("error", err))
		_ = m.TermWithReason("undecodable: " + err.Error())
		return
	}
	// The event is handled to the end even when ctx ends, within AckWait.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.AckWait)
	defer cancel()
	retry, err := h(hctx, msg, delivered)
	if err != nil {
		cfg.Logger.Log(ctx, FailureLevel(err, delivered), "handle event failed; redelivering", slog.String("event_id", msg.ID.String()),
			slog.String("type", msg.Type), slog.String("order_id", msg.AggregateID), slog.Int("delivery", delivered),
			slog.Duration("retry_in", retry), slog.Any("error", err))
		_ = m.NakWithDelay(retry)
		return
	}
	if err := m.Ack(); err != nil {
		cfg.Logger.Warn("ack failed; the redelivery will be a duplicate", slog.String("event_id", msg.ID.String()), slog.Any("error", err))
	}
}

// FailureLevel is the level of the line logging a failed delivery: debug
// for ErrEarly; warn for the deliveries numbered 1, 2, 4, 8, ... (a power
// of two) and debug for the others, so that an event failing for an hour
// at a 10 s delay logs about 9 warnings rather than 360.
func FailureLevel(err error, delivery int) slog.Level {
	if errors.Is(err, ErrEarly) || delivery > 1 && delivery&(delivery-1) != 0 {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// Backoff doubles base for each attempt after the first, up to max: the
// waits of the consumers' reconnection loops (a delivery's redelivery
// delay is an inbox.Backoff's).
func Backoff(attempt int, base, max time.Duration) time.Duration {
	return backoff.Exponential(attempt, base, max)
}

// Sleep waits for d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
