package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox/examples/orders/internal/natsloop"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// errCommitDropped ends a Kafka session whose commit the failpoint dropped:
// the consumer rejoins and reads again from the last committed offset.
var errCommitDropped = errors.New("offset commit dropped (failpoint)")

// RunKafka consumes topic from the Kafka brokers as the consumer group
// Config.Durable until ctx ends, then finishes the records it holds,
// commits their offsets, leaves the group and returns nil. opts are passed
// to kgo.NewClient before the consumer's own (for TLS, SASL, logging).
//
// The relay keys each record by its aggregate id, so an order's events are
// on one partition in sequence order: the consumer processes each
// partition's records one after the other, up to Workers partitions at a
// time, each record through the inbox like every transport. It commits a
// partition's offset only once the inbox transactions of the records before
// it committed, and a rebalance waits for those commits (at-least-once: a
// consumer that crashes before committing has its records delivered again,
// and the inbox drops what it applied already). A record that cannot be
// applied yet is tried again in place, holding its partition back; an
// undecodable record is counted, logged and skipped. While the brokers are
// unreachable, the client keeps retrying.
func (c *Consumer) RunKafka(ctx context.Context, brokers []string, topic string, opts ...kgo.Opt) error {
	if len(brokers) == 0 || topic == "" {
		return errors.New("inventory: RunKafka needs brokers and a topic")
	}
	c.log.Info("inventory consumer starting", slog.Any("brokers", brokers), slog.String("topic", topic),
		slog.String("group", c.cfg.Durable), slog.Int("workers", c.cfg.Workers))
	failures := 0
	for ctx.Err() == nil {
		err := c.kafkaSession(ctx, brokers, topic, opts)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, errCommitDropped) {
			continue
		}
		failures++
		d := natsloop.Backoff(failures, 250*time.Millisecond, 5*time.Second)
		c.log.Warn("kafka session ended; rejoining", slog.Any("error", err), slog.Duration("retry_in", d))
		natsloop.Sleep(ctx, d)
	}
	c.log.Info("inventory consumer stopped", slog.Any("stats", c.Stats()))
	return nil
}

// kafkaSession is one membership of the group: poll, process, commit,
// until ctx ends (nil) or a commit is dropped or fails.
func (c *Consumer) kafkaSession(ctx context.Context, brokers []string, topic string, opts []kgo.Opt) error {
	all := append(append([]kgo.Opt(nil), opts...),
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("orders-inventory"),
		kgo.ConsumerGroup(c.cfg.Durable),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.SessionTimeout(c.cfg.SessionTimeout),
		kgo.HeartbeatInterval(min(c.cfg.SessionTimeout/4, 3*time.Second)),
		// A rebalance waits this long for every member to rejoin, so a
		// member killed mid-rebalance holds the whole group for it (60 s by
		// default): twice the session timeout is ample for a member that
		// finishes its poll (16 records a worker) and commits.
		kgo.RebalanceTimeout(2*c.cfg.SessionTimeout),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close() // leaves the group
	for {
		fs := cl.PollRecords(ctx, 16*c.cfg.Workers)
		if fs.IsClientClosed() {
			return errors.New("kafka client closed")
		}
		fetchFailed := false
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				fetchFailed = true
				c.log.Warn("fetch", slog.String("topic", t), slog.Int("partition", int(p)), slog.Any("error", err))
			}
		})
		if fetchFailed && fs.NumRecords() == 0 {
			natsloop.Sleep(ctx, 250*time.Millisecond) // the client retries; do not spin on its errors
		}
		done, dropped := c.kafkaBatch(ctx, fs)
		if len(done) > 0 {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := cl.CommitRecords(cctx, done...)
			cancel()
			if err != nil {
				cl.AllowRebalance()
				return fmt.Errorf("commit offsets: %w", err)
			}
		}
		cl.AllowRebalance()
		if dropped {
			return errCommitDropped
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// kafkaBatch processes a poll's records, partition by partition, and
// returns each partition's last record to commit, and whether the failpoint
// dropped a commit.
func (c *Consumer) kafkaBatch(ctx context.Context, fs kgo.Fetches) (done []*kgo.Record, dropped bool) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, c.cfg.Workers)
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			last, drop := c.kafkaPartition(ctx, p.Records)
			mu.Lock()
			defer mu.Unlock()
			if last != nil {
				done = append(done, last)
			}
			dropped = dropped || drop
		})
	})
	wg.Wait()
	return done, dropped
}

// kafkaPartition processes one partition's records in order and returns the
// last one settled (nil if none), and whether the failpoint dropped the
// commit of the one after it. It stops early when ctx ends while a record
// waits to be tried again.
func (c *Consumer) kafkaPartition(ctx context.Context, recs []*kgo.Record) (last *kgo.Record, dropped bool) {
	for _, r := range recs {
		for delivery := 1; ; delivery++ {
			c.delivered.Add(1)
			msg, err := outboxkafka.Decode(r)
			if err != nil {
				c.rejected.Add(1)
				c.log.Error("undecodable record skipped", slog.String("topic", r.Topic), slog.Int("partition", int(r.Partition)),
					slog.Int64("offset", r.Offset), slog.Any("error", err))
				break
			}
			v, d := c.deliver(ctx, msg, delivery)
			if v == settle {
				break
			}
			if v == dropAck {
				return last, true
			}
			if ctx.Err() != nil {
				return last, false // delivered again to whoever has the partition next
			}
			natsloop.Sleep(ctx, d)
		}
		last = r
	}
	return last, false
}
