package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// natsBundle is a stream of the test's own on a NATS server.
type natsBundle struct {
	js     jetstream.JetStream
	pub    *outboxnats.Publisher
	stream string
	prefix string
}

func newNATS(t testing.TB, url string, window time.Duration) natsBundle {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatalf("connect to NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b := natsBundle{js: js, stream: "S_" + outboxtest.UniqueName(t, "r"), prefix: outboxtest.UniqueName(t, "r")}
	b.pub, err = outboxnats.NewPublisher(context.Background(), js, outboxnats.Config{Stream: b.stream, SubjectPrefix: b.prefix, DuplicateWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), b.stream) })
	return b
}

// streamEvents reads the whole stream back, in stream order.
func (b natsBundle) streamEvents(t *testing.T) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []outbox.Message
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get stream message %d: %v", seq, err)
		}
		m, err := outboxnats.Decode(raw.Header, raw.Data)
		if err != nil {
			t.Fatalf("decode stream message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// checkBrokerOrder asserts I5 at the broker: per aggregate, the first
// appearance of each sequence is in increasing order with no gap.
func checkBrokerOrder(t *testing.T, msgs []outbox.Message) map[uuid.UUID]int {
	t.Helper()
	next := map[string]int64{}
	seen := map[uuid.UUID]int{}
	for _, m := range msgs {
		seen[m.ID]++
		if seen[m.ID] > 1 {
			continue
		}
		key := m.AggregateType + "/" + m.AggregateID
		if want := next[key] + 1; m.Sequence != want {
			t.Fatalf("I5 violated: aggregate %s: sequence %d reached the broker when %d was expected", key, m.Sequence, want)
		}
		next[key] = m.Sequence
	}
	return seen
}

func startRelay(t *testing.T, pool *pgxpool.Pool, cfg outbox.RelayConfig) (*outbox.Relay, func()) {
	t.Helper()
	r, err := outbox.NewRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay %s: %v", r.ID(), err)
			}
		})
	}
	t.Cleanup(stop)
	return r, stop
}

func writeEvents(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, aggregates, perAggregate int) []outbox.Recorded {
	t.Helper()
	ctx := context.Background()
	var all []outbox.Recorded
	for round := 0; round < perAggregate; round++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			evs := make([]outbox.Event, aggregates)
			for a := range evs {
				evs[a] = orderEvent("agg-"+strconv.Itoa(a), fmt.Sprintf("Step%d", round))
			}
			recs, err := w.InsertTx(ctx, tx, evs...)
			all = append(all, recs...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return all
}

func unpublished(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".outbox_events WHERE published_at IS NULL").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func quietConfig(schema string, pub outbox.Publisher) outbox.RelayConfig {
	return outbox.RelayConfig{Schema: schema, Publisher: pub, PollInterval: 20 * time.Millisecond,
		RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond, Logger: discardLogger()}
}

// TestSeveralRelaysKeepAggregateOrder runs three relays on one table while
// writers keep adding events: everything is published (I3), and no aggregate
// sees k+1 before k at the broker (I5).
func TestSeveralRelaysKeepAggregateOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)

	var relays []*outbox.Relay
	for i := 0; i < 3; i++ {
		cfg := quietConfig(schema, b.pub)
		cfg.BatchSize = 25
		cfg.ID = fmt.Sprintf("relay-%d", i)
		r, _ := startRelay(t, pool, cfg)
		relays = append(relays, r)
	}
	// Writers run while the relays drain, so heads keep moving under them.
	var wg sync.WaitGroup
	var written atomic.Int64
	for wr := 0; wr < 4; wr++ {
		wg.Add(1)
		go func(wr int) {
			defer wg.Done()
			for i := 0; i < 60; i++ {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := w.InsertTx(ctx, tx,
						orderEvent(fmt.Sprintf("a%d", i%10), fmt.Sprintf("W%d-%d", wr, i)),
						orderEvent(fmt.Sprintf("a%d", (i+wr)%10), fmt.Sprintf("W%d-%d-b", wr, i)))
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				written.Add(2)
			}
		}(wr)
	}
	wg.Wait()
	outboxtest.Eventually(t, 60*time.Second, "all events published", func() bool { return unpublished(t, pool, schema) == 0 })

	msgs := b.streamEvents(t)
	seen := checkBrokerOrder(t, msgs)
	if int64(len(seen)) != written.Load() {
		t.Fatalf("%d distinct events at the broker, %d written", len(seen), written.Load())
	}
	var published int64
	for _, r := range relays {
		published += r.Stats().Published
	}
	if published != written.Load() {
		t.Fatalf("relays marked %d events, %d written", published, written.Load())
	}
}

// failingPublisher injects faults in front of the real NATS publisher.
type failingPublisher struct {
	next outbox.Publisher
	fail func(m outbox.Message) error // nil error: pass through
}

func (p failingPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	var pass []outbox.Message
	var idx []int
	for i, m := range msgs {
		if err := p.fail(m); err != nil {
			errs[i] = err
			continue
		}
		pass = append(pass, m)
		idx = append(idx, i)
	}
	if len(pass) > 0 {
		if res := p.next.Publish(ctx, pass); res != nil {
			for j, err := range res {
				errs[idx[j]] = err
			}
		}
	}
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// TestFailedEventBacksOffAndBlocksItsLaneOnly: a retryable failure backs the
// event off with attempt_count and last_error recorded; its aggregate's later
// events wait behind it while other aggregates flow; after the fault clears
// the lane drains in order.
func TestFailedEventBacksOffAndBlocksItsLaneOnly(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	var healed atomic.Bool
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "agg-0" && !healed.Load() {
			return errors.New("broker said no")
		}
		return nil
	}}
	writeEvents(t, pool, w, 3, 4)
	cfg := quietConfig(schema, pub)
	cfg.RetryBackoffMin, cfg.RetryBackoffMax = 20*time.Millisecond, 20*time.Millisecond
	startRelay(t, pool, cfg)

	outboxtest.Eventually(t, 30*time.Second, "other lanes drained, agg-0 retried", func() bool {
		var others, attempts int
		err := pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM `+schema+`.outbox_events WHERE aggregate_id <> 'agg-0' AND published_at IS NULL),
			(SELECT attempt_count FROM `+schema+`.outbox_events WHERE aggregate_id = 'agg-0' AND aggregate_sequence = 1)`).Scan(&others, &attempts)
		return err == nil && others == 0 && attempts >= 3
	})
	var lastErr string
	var laterAttempts int
	if err := pool.QueryRow(context.Background(), `SELECT
		(SELECT last_error FROM `+schema+`.outbox_events WHERE aggregate_id = 'agg-0' AND aggregate_sequence = 1),
		(SELECT sum(attempt_count) FROM `+schema+`.outbox_events WHERE aggregate_id = 'agg-0' AND aggregate_sequence > 1)`).Scan(&lastErr, &laterAttempts); err != nil {
		t.Fatal(err)
	}
	if lastErr != "broker said no" || laterAttempts != 0 {
		t.Fatalf("head last_error %q, later events' attempts %d: want the error recorded and the lane held", lastErr, laterAttempts)
	}
	healed.Store(true)
	outboxtest.Eventually(t, 30*time.Second, "lane drained after the fault cleared", func() bool { return unpublished(t, pool, schema) == 0 })
	seen := checkBrokerOrder(t, b.streamEvents(t))
	if len(seen) != 12 {
		t.Fatalf("%d events at the broker, want 12", len(seen))
	}
}

// TestPermanentErrorQuarantines: a permanent failure quarantines the event at
// once, and its aggregate's later events stay behind it.
func TestPermanentErrorQuarantines(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	pub := failingPublisher{next: b.pub, fail: func(m outbox.Message) error {
		if m.AggregateID == "agg-1" && m.Sequence == 2 {
			return outbox.Permanent(errors.New("schema registry refused it"))
		}
		return nil
	}}
	writeEvents(t, pool, w, 2, 3)
	r, _ := startRelay(t, pool, quietConfig(schema, pub))
	outboxtest.Eventually(t, 30*time.Second, "agg-0 drained and agg-1/2 quarantined", func() bool {
		return unpublished(t, pool, schema) == 2 && r.Stats().Quarantined == 1
	})
	var quarantined, attempts int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE quarantined_at IS NOT NULL), max(attempt_count)
		FROM `+schema+`.outbox_events WHERE aggregate_id = 'agg-1' AND published_at IS NULL`).Scan(&quarantined, &attempts); err != nil {
		t.Fatal(err)
	}
	if quarantined != 1 || attempts != 1 {
		t.Fatalf("%d quarantined, max attempts %d; want 1 and 1", quarantined, attempts)
	}
	checkBrokerOrder(t, b.streamEvents(t))
}

// TestBrokerOutageWaitsAndRecovers stops an embedded NATS server under the
// relay: events wait, untouched (no attempt spent, available_at unchanged),
// while the relay reports the outage, then flow when the server returns
// (I3).
func TestBrokerOutageWaitsAndRecovers(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	dir := t.TempDir()
	srv, err := outboxnats.StartEmbedded(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	b := newNATS(t, url, 0)
	cfg := quietConfig(schema, b.pub)
	cfg.MaxAttempts = 2 // an outage must not use these up
	r, _ := startRelay(t, pool, cfg)

	writeEvents(t, pool, w, 5, 2)
	outboxtest.Eventually(t, 30*time.Second, "first events published", func() bool { return unpublished(t, pool, schema) == 0 })

	srv.Shutdown()
	writeEvents(t, pool, w, 5, 2)
	outboxtest.Eventually(t, 30*time.Second, "relay saw the outage and reports it", func() bool {
		err := r.Ready()
		return r.Stats().Failed >= 5 && err != nil && strings.Contains(err.Error(), "destination unavailable")
	})
	// The outage is the destination's: the events were released untouched,
	// due at once (a release moves available_at to its own moment, never
	// later: docs/design.md, "Claiming only what is new").
	var attempts, quarantined, moved int
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(attempt_count), 0), count(quarantined_at),
		count(*) FILTER (WHERE available_at > now() OR last_error IS NOT NULL)
		FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&attempts, &quarantined, &moved); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || quarantined != 0 || moved != 0 {
		t.Fatalf("during the outage: attempts %d, quarantined %d, %d events with available_at or last_error changed; want none", attempts, quarantined, moved)
	}

	port := portOf(t, url)
	srv2, err := outboxnats.StartEmbedded(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv2.Shutdown)
	outboxtest.Eventually(t, 60*time.Second, "events published after the broker returned", func() bool { return unpublished(t, pool, schema) == 0 })
	seen := checkBrokerOrder(t, b.streamEvents(t))
	if len(seen) != 20 {
		t.Fatalf("%d events at the broker, want 20", len(seen))
	}
}

// stallingPublisher holds every publish of one relay until released, to
// model a relay paused past its lease (GC pause, frozen VM).
type stallingPublisher struct {
	next    outbox.Publisher
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (p *stallingPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	p.once.Do(func() { close(p.entered) })
	<-p.release
	return p.next.Publish(ctx, msgs)
}

// TestExpiredLeaseIsTakenOverAndStaleMarksAreFenced: relay A claims and
// stalls past its lease; relay B takes the events over and publishes them;
// when A resumes, its write-backs are refused by the claim token.
func TestExpiredLeaseIsTakenOverAndStaleMarksAreFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	writeEvents(t, pool, w, 4, 1)

	stall := &stallingPublisher{next: b.pub, entered: make(chan struct{}), release: make(chan struct{})}
	cfgA := quietConfig(schema, stall)
	cfgA.ID, cfgA.LeaseDuration = "relay-a", 300*time.Millisecond
	a, stopA := startRelay(t, pool, cfgA)
	<-stall.entered

	cfgB := quietConfig(schema, b.pub)
	cfgB.ID, cfgB.LeaseDuration = "relay-b", 300*time.Millisecond
	bRelay, _ := startRelay(t, pool, cfgB)
	outboxtest.Eventually(t, 30*time.Second, "relay B took over and published", func() bool { return unpublished(t, pool, schema) == 0 })
	if got := bRelay.Stats().TakenOver; got != 4 {
		t.Fatalf("relay B took over %d events, want 4", got)
	}
	var before time.Time
	if err := pool.QueryRow(ctx, "SELECT max(published_at) FROM "+schema+".outbox_events").Scan(&before); err != nil {
		t.Fatal(err)
	}

	close(stall.release) // A wakes up and finishes its stale batch
	outboxtest.Eventually(t, 30*time.Second, "relay A's stale marks refused", func() bool { return a.Stats().LeaseConflicts == 4 })
	stopA()
	var after time.Time
	if err := pool.QueryRow(ctx, "SELECT max(published_at) FROM "+schema+".outbox_events").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !after.Equal(before) || a.Stats().Published != 0 {
		t.Fatalf("stale relay changed rows: published_at %v -> %v, A marked %d", before, after, a.Stats().Published)
	}
	checkBrokerOrder(t, b.streamEvents(t))
}

// TestShutdownReleasesClaims: a relay stopped mid-publish releases what it
// did not publish, so another relay need not wait for the lease.
func TestShutdownReleasesClaims(t *testing.T) {
	t.Parallel()
	pool, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	writeEvents(t, pool, w, 3, 1)
	stall := &stallingPublisher{next: b.pub, entered: make(chan struct{}), release: make(chan struct{})}
	cfg := quietConfig(schema, outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		stall.once.Do(func() { close(stall.entered) })
		<-ctx.Done() // never acknowledged: the shutdown timeout cuts it
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = outbox.Unavailable(ctx.Err())
		}
		return errs
	}))
	cfg.ShutdownTimeout = 50 * time.Millisecond
	cfg.LeaseDuration = time.Hour
	_, stop := startRelay(t, pool, cfg)
	<-stall.entered
	stop()
	var leased int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".outbox_events WHERE claim_token IS NOT NULL").Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if leased != 0 {
		t.Fatalf("%d events still leased after shutdown", leased)
	}
}
