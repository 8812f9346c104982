package inbox

import (
	"math/rand/v2"
	"time"
)

// Bounds of RedeliveryDelay, and the defaults of Backoff's Min and Max.
const (
	// RedeliveryDelayMin is the delay after an event's first delivery: an
	// Early event usually waits for its predecessor's redelivery, which is
	// already under way.
	RedeliveryDelayMin = 100 * time.Millisecond
	// RedeliveryDelayMax caps the delay, so that a gap that closes is
	// noticed within seconds, while an aggregate that stays stuck costs one
	// delivery per RedeliveryDelayMax, not a hot loop.
	RedeliveryDelayMax = 10 * time.Second
)

// Backoff is how long a consumer waits before an event it did not settle
// (Handle said Early, or the effect failed) is delivered again, by the
// number of the delivery just handled (1 for the first, as JetStream's
// NumDelivered counts): Min after the first delivery, doubling with each
// further one, capped at Max, with jitter so that the deliveries of many
// events refused together do not come back in step.
//
// Each transport applies it its own way:
//
//   - NATS JetStream: msg.NakWithDelay(b.Delay(int(md.NumDelivered)));
//   - Kafka: the partition's offset stays put; wait the delay (or pause the
//     partition for it, PauseFetchPartitions, and seek back to the record)
//     and handle the record again, counting the deliveries yourself;
//   - RabbitMQ: hold the delivery for the delay, then Nack(false, true)
//     (requeue), counting the deliveries per message id (the broker only
//     says Redelivered); or route it through a queue with a per-message
//     TTL and a dead-letter exchange back to the work queue;
//   - a webhook receiver: answer with outbox.RetryAfter(err, b.Delay(n)),
//     which becomes the response's Retry-After.
//
// The zero Backoff is RedeliveryDelay's: RedeliveryDelayMin to
// RedeliveryDelayMax.
type Backoff struct {
	// Min is the delay after the first delivery. Defaults to
	// RedeliveryDelayMin.
	Min time.Duration
	// Max caps the delay. Defaults to RedeliveryDelayMax; a Max below Min
	// is taken as Min.
	Max time.Duration
}

// Delay is the wait before the delivery after delivery number delivery (1
// for the first; 0 or less counts as 1). Without jitter it would be Min ×
// 2^(delivery-1), capped at Max; Delay returns a uniform draw between half
// of that and all of it, never below Min. So Delay(1) is Min, and every
// Delay lies in [Min, Max].
func (b Backoff) Delay(delivery int) time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = RedeliveryDelayMin
	}
	if hi <= 0 {
		hi = RedeliveryDelayMax
	}
	hi = max(hi, lo)
	d := lo
	for i := 1; i < delivery && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	floor := max(d/2, lo)
	return floor + rand.N(d-floor+1)
}

// RedeliveryDelay is Backoff{}.Delay(delivery): the wait before an Early
// event (or one whose effect failed) is delivered again, from
// RedeliveryDelayMin after its first delivery up to RedeliveryDelayMax.
func RedeliveryDelay(delivery int) time.Duration { return Backoff{}.Delay(delivery) }
