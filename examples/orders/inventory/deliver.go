package inventory

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/internal/natsloop"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/failpoint"
)

// verdict is what a transport does with a delivery once deliver has seen
// it.
type verdict int

const (
	// settle: applied, or a duplicate of an applied event; acknowledge it
	// (NATS) or move the committed offset past it (Kafka).
	settle verdict = iota
	// again: not applied (a failure, or an earlier event of the order is
	// missing); deliver it again after the delay.
	again
	// dropAck: applied, but the failpoint drops the acknowledgement or the
	// commit, as a crash there would; the redelivery will be a duplicate.
	dropAck
)

// deliver is the one code path every transport hands a decoded event to:
// it applies the event through the inbox (Handle), logs what is worth a
// line, passes the failpoint between the commit and the ack, and says what
// to do with the delivery. delivery is the delivery's number (1 for the
// first), which lengthens the delays. The event is handled to the end even
// when ctx ends, within AckWait.
func (c *Consumer) deliver(ctx context.Context, msg outbox.Message, delivery int) (verdict, time.Duration) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.AckWait)
	defer cancel()
	out, err := c.Handle(hctx, msg)
	if err != nil {
		d := inbox.Backoff{Min: c.cfg.RetryDelay, Max: RetryDelayMax}.Delay(delivery)
		c.log.Log(ctx, natsloop.FailureLevel(err, delivery), "apply event failed; redelivering", slog.String("event_id", msg.ID.String()),
			slog.String("order_id", msg.AggregateID), slog.Int64("sequence", msg.Sequence),
			slog.Int("delivery", delivery), slog.Duration("retry_in", d), slog.Any("error", err))
		return again, d
	}
	if out == inbox.Early {
		// An earlier event of this order is not applied yet: let it arrive.
		return again, inbox.Backoff{Min: c.cfg.EarlyDelay}.Delay(delivery)
	}
	if out == inbox.Duplicate {
		// Worth a line: a duplicate means a failure upstream (a lost ack, a
		// relay that crashed between the broker's ack and its mark), which
		// it names when the failpoint dropped this event's ack.
		attrs := []any{slog.String("event_id", msg.ID.String()), slog.String("order_id", msg.AggregateID),
			slog.Int64("sequence", msg.Sequence), slog.Int("delivery", delivery)}
		if _, injected := c.ackDropped.LoadAndDelete(msg.ID); injected {
			attrs = append(attrs, slog.String("cause", "ack dropped by failpoint "+FailpointAfterCommitBeforeAck), slog.Bool("injected", true))
		}
		c.log.Info("duplicate delivery suppressed: already applied", attrs...)
	}
	if err := failpoint.Hit(FailpointAfterCommitBeforeAck); err != nil {
		c.ackDropped.Store(msg.ID, true)
		c.log.Info("ack dropped: injected fault; the redelivery will be a duplicate", slog.String("event_id", msg.ID.String()),
			slog.String("failpoint", FailpointAfterCommitBeforeAck), slog.Bool("injected", true))
		return dropAck, c.cfg.EarlyDelay
	}
	return settle, 0
}
