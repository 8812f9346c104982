package outboxfleet_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxnats"
)

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// migrateSchemas creates and migrates the schemas, a few at a time, and
// drops them when the test ends.
func migrateSchemas(t *testing.T, pool *pgxpool.Pool, names ...string) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, len(names))
	sem := make(chan struct{}, 4)
	for _, s := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := outboxmigrate.Migrate(ctx, pool, s); err != nil {
				errs <- fmt.Errorf("migrate %s: %w", s, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range names {
			if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
				t.Errorf("drop schema %s: %v", s, err)
			}
		}
	})
}

// stream is a JetStream stream of the test's own on the shared NATS server.
type stream struct {
	js  jetstream.JetStream
	pub *outboxnats.Publisher
	cfg outboxnats.Config
}

func newStream(t *testing.T) stream {
	t.Helper()
	js := natstest.JetStream(t, natstest.Conn(t))
	cfg := natstest.Config(t)
	return stream{js: js, pub: natstest.Publisher(t, js, cfg), cfg: cfg}
}

// messages reads the stream back, in stream order.
func (s stream) messages(t *testing.T) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	st, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []outbox.Message
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		raw, err := st.GetMsg(ctx, seq)
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

// count is how many messages the stream holds.
func (s stream) count(t *testing.T) uint64 {
	t.Helper()
	st, err := s.js.Stream(context.Background(), s.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// written records the events a test wrote, by id.
type written struct {
	mu  sync.Mutex
	ids map[uuid.UUID]outbox.Recorded
	agg map[uuid.UUID]string // event id -> aggregate type
}

// write writes perAggregate events to each of the aggregates (ids unique to
// the schema), one transaction per round.
func (w *written) write(t *testing.T, pool *pgxpool.Pool, schema, aggregateType string, aggregates, perAggregate int) {
	t.Helper()
	wr, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for round := 0; round < perAggregate; round++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			evs := make([]outbox.Event, aggregates)
			for a := range evs {
				id := fmt.Sprintf("%s-%d", schema, a)
				evs[a] = outbox.Event{AggregateType: aggregateType, AggregateID: id, Type: fmt.Sprintf("Step%d", round), Payload: []byte(`{}`)}
			}
			recs, err := wr.InsertTx(ctx, tx, evs...)
			if err != nil {
				return err
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.ids == nil {
				w.ids, w.agg = map[uuid.UUID]outbox.Recorded{}, map[uuid.UUID]string{}
			}
			for _, r := range recs {
				w.ids[r.ID] = r
				w.agg[r.ID] = aggregateType
			}
			return nil
		})
		if err != nil {
			t.Fatalf("write to %s: %v", schema, err)
		}
	}
}

func (w *written) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ids)
}

// checkDelivered fails the test unless msgs hold every event written (with
// filter true) and no aggregate's events arrived out of sequence order.
func (w *written) checkDelivered(t *testing.T, msgs []outbox.Message, filter func(aggregateType string) bool) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[uuid.UUID]bool{}
	last := map[string]int64{}
	for _, m := range msgs {
		key := m.AggregateType + "/" + m.AggregateID
		if m.Sequence < last[key] {
			t.Fatalf("aggregate %s: sequence %d arrived after %d", key, m.Sequence, last[key])
		}
		last[key] = m.Sequence
		seen[m.ID] = true
	}
	missing := 0
	for id, typ := range w.agg {
		if filter != nil && !filter(typ) {
			if seen[id] {
				t.Fatalf("event %x of aggregate type %s reached a destination it is not routed to", id, typ)
			}
			continue
		}
		if !seen[id] {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d events written were not delivered", missing)
	}
}

// runFleet starts a fleet and stops it when the test ends.
func runFleet(t *testing.T, cfg outboxfleet.Config, opts outboxfleet.Options) *outboxfleet.Fleet {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	f, err := outboxfleet.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fleet: %v", err)
		}
		f.Close()
	})
	return f
}

// publishers opens destinations by name from a map, whatever their URL.
func publishers(pubs map[string]outbox.Publisher) func(context.Context, string, string) (outbox.Publisher, func(), error) {
	return func(_ context.Context, name, _ string) (outbox.Publisher, func(), error) {
		p, ok := pubs[name]
		if !ok {
			return nil, nil, fmt.Errorf("no publisher %s", name)
		}
		return p, nil, nil
	}
}

// running lists the running sources' schemas.
func running(f *outboxfleet.Fleet) map[string]bool {
	out := map[string]bool{}
	for _, s := range f.Sources() {
		if s.State == "running" {
			out[s.Schema] = true
		}
	}
	return out
}

func unpublishedIn(t *testing.T, pool *pgxpool.Pool, schemas ...string) int {
	t.Helper()
	var parts []string
	for _, s := range schemas {
		parts = append(parts, "SELECT count(*) FROM "+s+".outbox_events WHERE published_at IS NULL")
	}
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT sum(c)::int FROM ("+strings.Join(parts, " UNION ALL ")+") x(c)").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, d time.Duration, msg string, cond func() bool) {
	t.Helper()
	outboxtest.Eventually(t, d, msg, cond)
}
