package outboxcdc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/outboxcdc"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxnats"
)

// logicalSettings make a private cluster able to decode its WAL.
func logicalSettings(extra map[string]string) map[string]string {
	s := map[string]string{"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}
	for k, v := range extra {
		s[k] = v
	}
	return s
}

// env is a private cluster with wal_level=logical and a migrated schema, a
// writer, and a NATS stream of the test's own on the shared server.
type env struct {
	cluster *pgcluster.Cluster
	url     string
	pool    *pgxpool.Pool
	schema  string
	w       *outbox.Writer
	js      jetstream.JetStream
	stream  string
	pub     *outboxnats.Publisher
}

func newEnv(t *testing.T, extra map[string]string) *env {
	t.Helper()
	c := outboxtest.PrivateCluster(t, pgcluster.Config{Settings: logicalSettings(extra)})
	ctx := context.Background()
	e := &env{cluster: c, url: c.URL(""), schema: "cdc_" + strconv.Itoa(os.Getpid())}
	var err error
	if e.pool, err = pgxpool.New(ctx, e.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	if _, err := outboxmigrate.Migrate(ctx, e.pool, e.schema); err != nil {
		t.Fatal(err)
	}
	if e.w, err = outbox.NewWriter(outbox.WriterConfig{Schema: e.schema}); err != nil {
		t.Fatal(err)
	}
	e.js = natstest.JetStream(t, natstest.Conn(t))
	cfg := natstest.Config(t)
	// A short deduplication window, so that republished events show up at
	// the broker as the duplicates they are.
	cfg.DuplicateWindow = 100 * time.Millisecond
	e.stream = cfg.Stream
	e.pub = natstest.Publisher(t, e.js, cfg)
	return e
}

func quiet() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// relay builds a relay on the env (not started). reconcile > 0 makes it a
// safety net.
func (e *env) relay(t *testing.T, id string, reconcile time.Duration, pub outbox.Publisher) *outbox.Relay {
	t.Helper()
	if pub == nil {
		pub = e.pub
	}
	r, err := outbox.NewRelay(e.pool, outbox.RelayConfig{
		Schema: e.schema, Publisher: pub, ID: id, ReconcileAfter: reconcile,
		PollInterval: 20 * time.Millisecond, LeaseDuration: time.Second,
		RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
		Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startCDC runs a CDC relay of group until the returned stop is called (or
// the test ends). opts change its configuration.
func (e *env) startCDC(t *testing.T, group string, r, safety *outbox.Relay, opts ...func(*outboxcdc.Config)) (*outboxcdc.Relay, func()) {
	t.Helper()
	cfg := outboxcdc.Config{
		DatabaseURL: e.url, Pool: e.pool, Schema: e.schema, Group: group,
		Relay: r, SafetyNet: safety, BatchSize: 50,
		StatusInterval: 200 * time.Millisecond, RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		StandbyInterval: 100 * time.Millisecond,
		Logger:          quiet().With(slog.String("cdc", r.ID())),
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := outboxcdc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("cdc relay %s: %v", r.ID(), err)
			}
		})
	}
	t.Cleanup(stop)
	return c, stop
}

// holdingPublisher passes messages to a Publisher, except that once armed
// its next Publish call waits until released.
type holdingPublisher struct {
	outbox.Publisher
	mu      sync.Mutex
	armed   bool
	release chan struct{}
	held    atomic.Bool // a Publish call is being held
	calls   atomic.Int64
}

func holding(p outbox.Publisher) *holdingPublisher {
	return &holdingPublisher{Publisher: p, release: make(chan struct{})}
}

// arm makes the next Publish call wait for release.
func (h *holdingPublisher) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = true
}

// unhold releases the held call (once).
func (h *holdingPublisher) unhold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

func (h *holdingPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	h.calls.Add(1)
	h.mu.Lock()
	armed := h.armed
	h.armed = false
	h.mu.Unlock()
	if armed {
		h.held.Store(true)
		select {
		case <-h.release:
		case <-ctx.Done():
		}
		h.held.Store(false)
	}
	return h.Publisher.Publish(ctx, msgs)
}

// walSender is the PID of the WAL sender streaming slot, and the time of
// its last reply from the relay (0 and zero when none streams it).
func (e *env) walSender(t *testing.T, slot string) (pid int, reply time.Time) {
	t.Helper()
	var p *int32
	var r *time.Time
	err := e.pool.QueryRow(context.Background(), `SELECT s.active_pid, r.reply_time FROM pg_replication_slots s
		LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&p, &r)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	if p != nil {
		pid = int(*p)
	}
	if r != nil {
		reply = *r
	}
	return pid, reply
}

// write commits txs transactions, each with one event for each of aggs
// aggregates, and returns the insert LSN read inside the last one (its
// commit ends after it).
func (e *env) write(t *testing.T, tag string, aggs, txs int) pglogrepl.LSN {
	t.Helper()
	ctx := context.Background()
	var lsn string
	for i := 0; i < txs; i++ {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			evs := make([]outbox.Event, aggs)
			for a := range evs {
				id := fmt.Sprintf("agg-%d", a)
				evs[a] = outbox.Event{AggregateType: "order", AggregateID: id, Type: fmt.Sprintf("%s-%d", tag, i), Payload: []byte(`{"order_id":"` + id + `"}`)}
			}
			if _, err := e.w.InsertTx(ctx, tx, evs...); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (e *env) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.schema+".outbox_events WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// confirmed is the slot's confirmed_flush_lsn (0 when the slot is missing).
func (e *env) confirmed(t *testing.T, slot string) pglogrepl.LSN {
	t.Helper()
	var s *string
	err := e.pool.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s)
	if err == pgx.ErrNoRows || s == nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	l, _ := pglogrepl.ParseLSN(*s)
	return l
}

// brokerMessages reads the test's stream back in order.
func (e *env) brokerMessages(t *testing.T) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, e.stream)
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
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// checkInvariants asserts, from the broker's stream, I3 (every one of want
// events arrived) and I5 (per aggregate, first deliveries in sequence
// order with no gap). It returns how many times each event arrived.
func checkInvariants(t *testing.T, msgs []outbox.Message, want int) map[uuid.UUID]int {
	t.Helper()
	next := map[string]int64{}
	seen := map[uuid.UUID]int{}
	for _, m := range msgs {
		seen[m.ID]++
		if seen[m.ID] > 1 {
			continue
		}
		key := m.AggregateType + "/" + m.AggregateID
		if w := next[key] + 1; m.Sequence != w {
			t.Fatalf("I5 violated: aggregate %s: sequence %d reached the broker when %d was expected", key, m.Sequence, w)
		}
		next[key] = m.Sequence
	}
	if len(seen) != want {
		t.Fatalf("I3: %d distinct events at the broker, want %d", len(seen), want)
	}
	return seen
}
