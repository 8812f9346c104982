package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxkafka"
)

// The "destinations" group: for each destination, side by side in one run,
// our relay beside a naive unordered publisher to the same broker (a
// backlog, and a backlog over 10 hot aggregates), and commit-to-ack latency
// at the latency scenario's offered rate with the wake-up.
//
// A destination is one entry of destinations; the scenarios are shared.

// destination is one entry of the group's table.
type destination struct {
	name string
	// pipelines: the publisher declares ordered pipelining
	// (outbox.OrderedPipeliner), so the hot-aggregates ratio has a target.
	pipelines bool
	// latencyTarget: the commit-to-ack p99 has the 25 ms target.
	latencyTarget bool
	// note says what the destination is in this run (in the results).
	note string
	// open readies the destination for space s (a stream, topic, queue...
	// of the space's own) and returns a publisher on it.
	open func(ctx context.Context, e *env, s space) (*target, error)
}

// target is a destination opened for one space.
type target struct {
	pub outbox.Publisher
	// check, when set, reads back what the destination holds after our
	// relay drained n events, checks I5 and returns how many distinct events
	// it holds.
	check func(ctx context.Context, n int) (int, error)
	// close closes the publisher and removes what open created (the space's
	// clean-up also removes a NATS stream of the space's name).
	close func()
}

// kafkaPartitions is how many partitions each pre-created Kafka topic has.
const kafkaPartitions = 8

const kafkaNote = "Kafka is franz-go's in-process fake cluster (kfake, 1 broker, in memory, no disk, no replication) " +
	"running inside the bench process: its figures show the relay's cost against Kafka's protocol (record batches, " +
	"idempotent producer, acks=all), not a real Kafka cluster's throughput or latency; the fake shares the bench's CPU"

var destinations = []destination{
	{name: "nats", latencyTarget: true, note: "the machine's NATS JetStream server, a stream of the run's own (file storage)",
		open: openNATS},
	{name: "kafka", pipelines: true, latencyTarget: true, note: kafkaNote, open: openKafka},
	{name: "amqp", latencyTarget: true, note: "the machine's RabbitMQ, an exchange and a durable classic queue of the run's own, publisher confirms",
		open: openAMQP},
	{name: "webhook", note: "an in-process net/http receiver on loopback (outboxwebhook.Receiver: verifies each request's signature, decodes the event, answers 204)",
		open: openWebhook},
}

func destinationNames() string {
	var names []string
	for _, d := range destinations {
		names = append(names, d.name)
	}
	return strings.Join(names, ",")
}

func openNATS(ctx context.Context, e *env, s space) (*target, error) {
	pub, nc, err := e.publisher(ctx, s)
	if err != nil {
		return nil, err
	}
	return &target{pub: pub, close: nc.Close,
		check: func(ctx context.Context, n int) (int, error) { return e.checkOrder(ctx, s.stream) }}, nil
}

// openKafka starts a kfake cluster of its own for the space, with the
// space's topic (its aggregate type "order") pre-created.
func openKafka(ctx context.Context, e *env, s space) (*target, error) {
	topic := s.prefix + ".order"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkaPartitions, topic))
	if err != nil {
		return nil, fmt.Errorf("kfake: %w", err)
	}
	pub, err := outboxkafka.NewPublisher(outboxkafka.Config{Brokers: c.ListenAddrs(), Topic: s.prefix + "." + outboxkafka.AggregateTypePlaceholder})
	if err != nil {
		c.Close()
		return nil, err
	}
	if err := pub.Probe(ctx); err != nil {
		pub.Close()
		c.Close()
		return nil, err
	}
	return &target{pub: pub,
		close: func() { pub.Close(); c.Close() },
		check: func(ctx context.Context, n int) (int, error) { return checkKafkaOrder(ctx, c.ListenAddrs(), topic, n) }}, nil
}

// orderCheck follows I5 over the events a destination holds, in the order
// it holds them: per aggregate, the first appearance of each sequence must
// come in increasing order, with no gap. It is safe for concurrent use.
type orderCheck struct {
	mu   sync.Mutex
	next map[string]int64
	seen map[uuid.UUID]bool
	err  error // the first violation
}

func newOrderCheck() *orderCheck {
	return &orderCheck{next: map[string]int64{}, seen: map[uuid.UUID]bool{}}
}

// add notes m, found at where (a partition, a queue, a receiver), and
// returns the first violation so far.
func (c *orderCheck) add(m outbox.Message, where string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[m.ID] {
		return c.err
	}
	c.seen[m.ID] = true
	agg := m.AggregateType + "/" + m.AggregateID
	if want := c.next[agg] + 1; m.Sequence != want && c.err == nil {
		c.err = fmt.Errorf("I5 violated: aggregate %s: sequence %d reached %s when %d was expected", agg, m.Sequence, where, want)
	}
	c.next[agg] = max(c.next[agg], m.Sequence)
	return c.err
}

// result is how many distinct events were added, and the first violation.
func (c *orderCheck) result() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen), c.err
}

// checkKafkaOrder reads n distinct events of topic back and checks I5 (see
// orderCheck). It returns how many distinct events it read.
func checkKafkaOrder(ctx context.Context, brokers []string, topic string, n int) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	oc := newOrderCheck()
	for got, _ := oc.result(); got < n; got, _ = oc.result() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return got, fmt.Errorf("topic %s: read %d of %d events: %w", topic, got, n, ctx.Err())
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) { ferr = fmt.Errorf("fetch %s/%d: %w", t, p, err) })
		if ferr != nil {
			return got, ferr
		}
		for _, r := range fs.Records() {
			m, err := outboxkafka.Decode(r)
			if err != nil {
				return got, err
			}
			if err := oc.add(m, fmt.Sprintf("partition %d", r.Partition)); err != nil {
				return got, err
			}
		}
	}
	return oc.result()
}

// naiveDrain is the naive unordered publisher, destination-generic: it
// claims the 1,000 oldest pending rows (SKIP LOCKED, a lease) ignoring
// aggregate order, passes them all to the destination's outbox.Publisher in
// one Publish call (which the relay never does: it never passes two events
// of one aggregate in a call unless the publisher declares ordered
// pipelining, and then only in sequence order), marks them published and
// repeats until n events are marked. Unlike relay/naive-unordered it reads
// the whole claim before it publishes, and it sends what the publisher
// sends (same encoding, same client settings), so the two sides differ only
// in ordering. Any failed message fails the drain.
func naiveDrain(ctx context.Context, e *env, s space, pub outbox.Publisher, n int) (time.Duration, error) {
	pool, err := e.relayPool(ctx, 2)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	events := s.schema + ".outbox_events"
	claim := `UPDATE ` + events + ` e SET claimed_by = 'naive', claim_until = now() + interval '30 seconds'
WHERE e.event_id IN (SELECT event_id FROM ` + events + `
	WHERE published_at IS NULL AND (claim_until IS NULL OR claim_until < now())
	ORDER BY available_at, occurred_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type, e.schema_version,
	coalesce(e.content_type, ` + quote(outbox.ContentTypeJSON) + `), e.payload, e.occurred_at`
	mark := `UPDATE ` + events + ` SET published_at = now(), claimed_by = NULL, claim_until = NULL WHERE event_id = ANY($1)`
	if err := pool.Ping(ctx); err != nil {
		return 0, err
	}
	var claimT, pubT, markT time.Duration
	start := time.Now()
	done := 0
	for done < n {
		t0 := time.Now()
		rows, err := pool.Query(ctx, claim)
		if err != nil {
			return 0, err
		}
		var msgs []outbox.Message
		var ids [][16]byte
		for rows.Next() {
			var m outbox.Message
			if err := rows.Scan(&m.ID, &m.AggregateType, &m.AggregateID, &m.Sequence, &m.Type, &m.SchemaVersion,
				&m.ContentType, &m.Payload, &m.OccurredAt); err != nil {
				rows.Close()
				return 0, err
			}
			m.OccurredAt, m.Attempt = m.OccurredAt.UTC(), 1
			msgs = append(msgs, m)
			ids = append(ids, m.ID)
		}
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if len(msgs) == 0 {
			return 0, fmt.Errorf("naive: nothing left to claim after %d of %d events", done, n)
		}
		t1 := time.Now()
		for i, err := range pub.Publish(ctx, msgs) {
			if err != nil {
				return 0, fmt.Errorf("naive: publish event %s: %w", msgs[i].ID, err)
			}
		}
		t2 := time.Now()
		if _, err := pool.Exec(ctx, mark, ids); err != nil {
			return 0, err
		}
		done += len(ids)
		claimT += t1.Sub(t0)
		pubT += t2.Sub(t1)
		markT += time.Since(t2)
	}
	elapsed := time.Since(start)
	per := func(d time.Duration) float64 { return ms(d) / float64(max(done, 1)) * 1000 }
	e.logf("%s: naive: claims %.2f ms, publish %.2f ms, marks %.2f ms per 1000 events", s.schema, per(claimT), per(pubT), per(markT))
	return elapsed, nil
}

// destDrain drains a fresh backlog of n events over aggs aggregates to d,
// with our relay (kind "ours", then checking I5 on the destination when it
// can) or the naive publisher (kind "naive").
func destDrain(ctx context.Context, e *env, d destination, name, kind string, n, aggs int) (time.Duration, string, error) {
	s, cleanup, err := e.newSpace(ctx, name)
	if err != nil {
		return 0, "", err
	}
	defer cleanup()
	if err := e.loadBacklog(ctx, s.schema, n, aggs, "o-", 1<<40, false); err != nil {
		return 0, "", err
	}
	t, err := d.open(ctx, e, s)
	if err != nil {
		return 0, "", fmt.Errorf("open %s: %w", d.name, err)
	}
	defer t.close()
	if kind == "naive" {
		elapsed, err := naiveDrain(ctx, e, s, t.pub, n)
		return elapsed, "", err
	}
	elapsed, _, err := drainOursTo(ctx, e, s, t.pub, n, nil)
	if err != nil || t.check == nil {
		return elapsed, "", err
	}
	distinct, err := t.check(ctx, n)
	if err != nil {
		return 0, "", fmt.Errorf("%s: %w", d.name, err)
	}
	if distinct != n {
		return 0, "", fmt.Errorf("%s holds %d distinct events of %d", d.name, distinct, n)
	}
	return elapsed, fmt.Sprintf("I5 checked on the destination (%d events)", distinct), nil
}

func benchDestinations(ctx context.Context, e *env) ([]Result, error) {
	var out []Result
	for _, d := range destinations {
		if e.o.dests != nil && !slices.Contains(e.o.dests, d.name) {
			continue
		}
		rs, err := benchDestination(ctx, e, d)
		out = append(out, rs...)
		if err != nil {
			return out, fmt.Errorf("%s: %w", d.name, err)
		}
	}
	return out, nil
}

// benchDestination runs the group's scenarios on one destination.
func benchDestination(ctx context.Context, e *env, d destination) ([]Result, error) {
	n, aggs := e.sz.backlog, e.sz.aggregates
	p := "dest/" + d.name + "/"
	var out []Result

	// (a) The backlog, ours and naive each on a fresh copy, in two rounds
	// of opposite order (as relay/ours).
	var oursT, naiveT time.Duration
	var checked string
	for round, order := range [][]string{{"ours", "naive"}, {"naive", "ours"}} {
		for _, kind := range order {
			elapsed, note, err := destDrain(ctx, e, d, fmt.Sprintf("dest-%s-%s-%d", d.name, kind, round), kind, n, aggs)
			if err != nil {
				return out, fmt.Errorf("%s drain: %w", kind, err)
			}
			if kind == "ours" {
				oursT += elapsed
				checked = note
			} else {
				naiveT += elapsed
			}
			e.logf("%s%s round %d: %.0f events/s (%s)", p, kind, round+1, float64(n)/elapsed.Seconds(), elapsed.Round(time.Millisecond))
		}
	}
	ours, naive := float64(2*n)/oursT.Seconds(), float64(2*n)/naiveT.Seconds()
	out = append(out,
		Result{Scenario: p + "relay-ours", EventsPerSec: f(ours), Ratio: f(ours / naive), RatioOf: p + "relay-naive",
			Target: ">= 0.80", Met: b(ours/naive >= 0.8), Events: int64(2 * n), Seconds: oursT.Seconds(),
			Note: fmt.Sprintf("two drains of %d events over %d aggregates, interleaved with the naive ones; %s; %s", n, aggs, checked, d.note)},
		Result{Scenario: p + "relay-naive", EventsPerSec: f(naive), Events: int64(2 * n), Seconds: naiveT.Seconds(),
			Note: "claim 1000 (SKIP LOCKED, no ordering), one Publish call with all 1000 through the same publisher, mark"})

	// (b) Commit-to-ack latency with the wake-up. The drains just wrote
	// hundreds of thousands of rows: without a checkpoint first, the one
	// PostgreSQL starts for their WAL runs during the measurement, and its
	// writes and fsyncs, not the relay, set the tail (NATS p99 136 ms after
	// a 200,000-event drain, 12 ms after a 10,000-event one).
	if _, err := e.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return out, fmt.Errorf("checkpoint before the latency run: %w", err)
	}
	lat, offered, err := latencyRunTo(ctx, e, "dest-"+d.name+"-latency", true, func(ctx context.Context, s space) (outbox.Publisher, func(), error) {
		t, err := d.open(ctx, e, s)
		if err != nil {
			return nil, nil, err
		}
		return t.pub, t.close, nil
	})
	if err != nil {
		return out, fmt.Errorf("latency: %w", err)
	}
	p50, p99, mx := percentiles(lat)
	res := Result{Scenario: p + "commit-to-ack-wakeup", EventsPerSec: f(offered), P50: f(p50), P99: f(p99), Max: f(mx),
		Events: int64(len(lat)), Seconds: e.sz.latencyDur.Seconds(),
		Note: fmt.Sprintf("offered %d events/s for %s, one event per transaction, Notifier wake-up", e.sz.latencyRate, e.sz.latencyDur)}
	if d.latencyTarget {
		res.Target, res.Met = "p99 <= 25 ms", b(p99 <= 25)
	}
	e.logf("%s: p50 %.1f ms p99 %.1f ms max %.1f ms at %.0f events/s", res.Scenario, p50, p99, mx, offered)
	out = append(out, res)

	// (c) Hot aggregates: a quarter of the backlog over 10 aggregates.
	hotN := n / 4
	hotT, note, err := destDrain(ctx, e, d, "dest-"+d.name+"-hot", "ours", hotN, 10)
	if err != nil {
		return out, fmt.Errorf("hot aggregates: %w", err)
	}
	hotNaiveT, _, err := destDrain(ctx, e, d, "dest-"+d.name+"-hot-naive", "naive", hotN, 10)
	if err != nil {
		return out, fmt.Errorf("hot aggregates, naive: %w", err)
	}
	hot, hotNaive := float64(hotN)/hotT.Seconds(), float64(hotN)/hotNaiveT.Seconds()
	e.logf("%shot: ours %.0f events/s, naive %.0f events/s", p, hot, hotNaive)
	hotRes := Result{Scenario: p + "ours-10-hot-aggregates", EventsPerSec: f(hot), Ratio: f(hot / hotNaive), RatioOf: p + "naive-10-hot-aggregates",
		Events: int64(hotN), Seconds: hotT.Seconds(), Note: fmt.Sprintf("%d events over 10 aggregates; %s", hotN, note)}
	if d.pipelines {
		hotRes.Target, hotRes.Met = ">= 0.90", b(hot/hotNaive >= 0.9)
		hotRes.Note += "; the publisher declares ordered pipelining: a lane's events go in one Publish call"
	} else {
		hotRes.Note += "; no ordered pipelining: a lane's events go one wave (one ack round trip) at a time; reported, no target"
	}
	out = append(out, hotRes,
		Result{Scenario: p + "naive-10-hot-aggregates", EventsPerSec: f(hotNaive), Events: int64(hotN), Seconds: hotNaiveT.Seconds()})
	return out, nil
}
