package outboxprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/inbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxnats"
	"github.com/pgoutbox/outbox/outboxprom"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// faulty fails some events in front of the real publisher.
type faulty struct {
	next outbox.Publisher
	mu   sync.Mutex
	seen map[uuid.UUID]int
	fail func(m outbox.Message, attempt int) error
}

func (p *faulty) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	var pass []outbox.Message
	var idx []int
	p.mu.Lock()
	for i, m := range msgs {
		p.seen[m.ID]++
		if err := p.fail(m, p.seen[m.ID]); err != nil {
			errs[i] = err
			continue
		}
		pass, idx = append(pass, m), append(idx, i)
	}
	p.mu.Unlock()
	if res := p.next.Publish(ctx, pass); res != nil {
		for j, err := range res {
			errs[idx[j]] = err
		}
	}
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

type dbFigures struct {
	pending, quarantined, published int64
	oldest                          float64
	tableBytes                      int64
}

func readDB(t *testing.T, pool *pgxpool.Pool, schema string) dbFigures {
	t.Helper()
	var f dbFigures
	if err := pool.QueryRow(context.Background(), `SELECT
		count(*) FILTER (WHERE published_at IS NULL AND quarantined_at IS NULL),
		count(*) FILTER (WHERE quarantined_at IS NOT NULL AND published_at IS NULL),
		count(*) FILTER (WHERE published_at IS NOT NULL AND skipped_at IS NULL),
		coalesce(extract(epoch FROM now() - min(occurred_at) FILTER (WHERE published_at IS NULL AND quarantined_at IS NULL)), 0)::float8,
		pg_total_relation_size($1::regclass)
		FROM `+schema+`.outbox_events`, schema+".outbox_events").Scan(&f.pending, &f.quarantined, &f.published, &f.oldest, &f.tableBytes); err != nil {
		t.Fatal(err)
	}
	return f
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := promrules.Value(fams, name, labels)
	if !ok {
		t.Fatalf("scrape has no single series %s%v", name, labels)
	}
	return v
}

func bucket(t *testing.T, fams map[string]*dto.MetricFamily, name string, le float64) uint64 {
	t.Helper()
	f := fams[name]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("scrape has no single histogram %s", name)
	}
	for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	t.Fatalf("histogram %s has no bucket le=%g", name, le)
	return 0
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestScrapeShowsWhatTheDatabaseHolds runs a relay with the metrics as its
// observer, with a poison event (quarantined, blocking its aggregate) and a
// flaky one (published on its third attempt), and an inbox consuming the
// stream twice; the scraped values match the database and what happened.
func TestScrapeShowsWhatTheDatabaseHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	js := natstest.JetStream(t, natstest.Conn(t))
	nats := natstest.Publisher(t, js, outboxnats.Config{})
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := outboxprom.New(outboxprom.Config{Schema: schema, Admin: admin, GaugesMaxAge: time.Nanosecond, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	admin, err = outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema, Observer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)

	const aggregates, perAggregate = 4, 4
	for round := 0; round < perAggregate; round++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for a := 0; a < aggregates; a++ {
				if _, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o%d", a),
					Type: "Step", Payload: []byte(`{}`)}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	pub := &faulty{next: nats, seen: map[uuid.UUID]int{}, fail: func(m outbox.Message, attempt int) error {
		switch {
		case m.AggregateID == "o1" && m.Sequence == 2:
			return outbox.Permanent(errors.New("rejected by the schema registry"))
		case m.AggregateID == "o2" && m.Sequence == 1 && attempt < 3:
			return errors.New("flaky broker")
		}
		return nil
	}}
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, Observer: metrics, Logger: discard(),
		PollInterval: 20 * time.Millisecond, RetryBackoffMin: 5 * time.Millisecond, RetryBackoffMax: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(outboxprom.Handler(reg, relay.Ready))
	t.Cleanup(srv.Close)
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the relay ran: %d %s, want 503", code, body)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
			<-done
		}
	})

	// Everything out but o1 #2 (quarantined) and o1 #3, #4 behind it.
	outboxtest.Eventually(t, 30*time.Second, "all but o1's tail published", func() bool {
		f := readDB(t, pool, schema)
		return f.published == aggregates*perAggregate-3 && f.quarantined == 1
	})
	stream, err := js.Stream(ctx, nats.Stream())
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(pool, inbox.Config{Schema: schema, Consumer: "billing", Observer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for pass := 0; pass < 2; pass++ {
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			raw, err := stream.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			m, err := outboxnats.Decode(raw.Header, raw.Data)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := in.Handle(ctx, m, func(context.Context, pgx.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}

	fams, err := promrules.Scrape(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	db := readDB(t, pool, schema)
	s := map[string]string{"schema": schema}
	with := func(k, v string) map[string]string { return map[string]string{"schema": schema, k: v} }
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"outbox_pending_events", s, float64(db.pending)},
		{"outbox_quarantined_events", s, float64(db.quarantined)},
		{"outbox_published_total", s, float64(db.published)},
		{"outbox_failures_total", with("reason", "permanent"), 1},
		{"outbox_failures_total", with("reason", "retryable"), 2},
		{"outbox_failures_total", with("reason", "unavailable"), 0},
		{"outbox_quarantined_total", s, 1},
		{"outbox_leased_events", s, 0},
		{"outbox_expired_leases", s, 0},
		{"outbox_relays_alive", s, 1},
		{"outbox_relay_up", s, 1},
		{"outbox_expired_claims_total", s, 0},
		{"outbox_lease_conflicts_total", s, 0},
		{"inbox_processed_total", with("consumer", "billing"), float64(db.published)},
		{"inbox_duplicates_total", with("consumer", "billing"), float64(db.published)},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %g, the database (or what happened) says %g", c.name, c.labels, got, c.want)
		}
	}
	if db.pending != 2 || db.quarantined != 1 {
		t.Fatalf("database: %+v, want 2 pending behind 1 quarantined", db)
	}
	if got := value(t, fams, "outbox_oldest_pending_age_seconds", s); math.Abs(got-db.oldest) > 5 || got <= 0 {
		t.Errorf("outbox_oldest_pending_age_seconds = %g, the database says %g", got, db.oldest)
	}
	if got := value(t, fams, "outbox_table_bytes", with("table", "outbox_events")); math.Abs(got-float64(db.tableBytes)) > 64<<10 {
		t.Errorf("outbox_table_bytes{outbox_events} = %g, the database says %d", got, db.tableBytes)
	}
	// Attempts: all published on the first attempt but o2 #1, on its third.
	if n1, n2, n3 := bucket(t, fams, "outbox_publish_attempts", 1), bucket(t, fams, "outbox_publish_attempts", 2), bucket(t, fams, "outbox_publish_attempts", 3); n1 != uint64(db.published-1) || n2 != n1 || n3 != uint64(db.published) {
		t.Errorf("outbox_publish_attempts buckets le=1,2,3: %d, %d, %d; want %d, %d, %d", n1, n2, n3, db.published-1, db.published-1, db.published)
	}
	for _, h := range []string{"outbox_broker_ack_seconds", "outbox_commit_to_publish_seconds"} {
		if n := fams[h].GetMetric()[0].GetHistogram().GetSampleCount(); n < uint64(db.published) {
			t.Errorf("%s counted %d events, want at least %d", h, n, db.published)
		}
	}
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz of a running relay: %d %s", code, body)
	}

	// Unstick: skip the poison; its aggregate drains and the gauges follow.
	if _, err := admin.Skip(ctx, eventIDOf(t, pool, schema, "o1", 2), "test", "poison"); err != nil {
		t.Fatal(err)
	}
	outboxtest.Eventually(t, 30*time.Second, "o1 drained after the skip", func() bool { return readDB(t, pool, schema).pending == 0 })
	stop()
	<-done
	stopped = true
	if _, err := pool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET published_at = published_at - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	res, err := admin.Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Hour, BatchSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	fams, err = promrules.Scrape(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"outbox_pending_events", s, 0},
		{"outbox_quarantined_events", s, 0},
		{"outbox_oldest_pending_age_seconds", s, 0},
		{"outbox_relays_alive", s, 0},
		{"outbox_published_total", s, float64(db.published + 2)},
		{"outbox_cleanup_deleted_total", with("table", "outbox_events"), float64(res.Events)},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("after skip, stop and clean-up: %s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	if res.Events != aggregates*perAggregate {
		t.Errorf("clean-up deleted %d events, want all %d", res.Events, aggregates*perAggregate)
	}
	if code, _ := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz of a stopped relay: %d, want 503", code)
	}
	if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d, want 200", code)
	}
}

func eventIDOf(t *testing.T, pool *pgxpool.Pool, schema, aggregateID string, seq int64) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	if err := pool.QueryRow(context.Background(), `SELECT event_id FROM `+schema+`.outbox_events WHERE aggregate_id = $1 AND aggregate_sequence = $2`,
		aggregateID, seq).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestGaugesAreSampledAtMostOncePerMaxAge: many scrapes within GaugesMaxAge
// cost one database sample; a failing sample leaves the gauges out and is
// counted.
func TestGaugesAreSampledAtMostOncePerMaxAge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	m, err := outboxprom.New(outboxprom.Config{Schema: schema, Admin: admin, GaugesMaxAge: time.Hour, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	pending := func() float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			byName[f.GetName()] = f
		}
		return value(t, byName, "outbox_pending_events", map[string]string{"schema": schema})
	}
	if got := pending(); got != 0 {
		t.Fatalf("pending %g, want 0", got)
	}
	w, _ := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "a", AggregateID: "1", Type: "T", Payload: []byte(`{}`)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := pending(); got != 0 {
		t.Fatalf("pending %g within GaugesMaxAge, want the cached 0", got)
	}

	// A schema without tables: the sample fails, the gauges are left out.
	bad, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: "no_such_schema_" + uuid.NewString()[:8]})
	if err != nil {
		t.Fatal(err)
	}
	m2, err := outboxprom.New(outboxprom.Config{Schema: "x", Admin: bad, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	reg2 := prometheus.NewPedanticRegistry()
	reg2.MustRegister(m2)
	fams, err := reg2.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		switch f.GetName() {
		case "outbox_pending_events":
			t.Fatal("a failed sample still exported outbox_pending_events")
		case "outbox_gauges_errors_total":
			if v := f.GetMetric()[0].GetCounter().GetValue(); v != 1 {
				t.Fatalf("outbox_gauges_errors_total = %g, want 1", v)
			}
		}
	}
}
