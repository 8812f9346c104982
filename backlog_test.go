package outbox_test

import (
	"context"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/natstest"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/promrules"
	"github.com/pgoutbox/outbox/outboxnats"
	"github.com/pgoutbox/outbox/outboxprom"
)

// The backlog scenario is small by default (CI); the figures in
// BENCHMARKS.md come from a large run:
//
//	go test -run TestBacklogDrains -count=1 -v . -args -backlog.events=200000 -backlog.history=1000000 -backlog.report=backlog.md
var (
	backlogEvents     = flag.Int("backlog.events", 3000, "events in the backlog built while no relay runs")
	backlogAggregates = flag.Int("backlog.aggregates", 0, "aggregates the backlog is spread over (default events/20)")
	backlogHistory    = flag.Int("backlog.history", 50000, "published rows added under 500 pending heads, to compare the claim's cost with a tenth of them and with all")
	backlogReport     = flag.String("backlog.report", "", "write the figures as Markdown to this file")
)

// tableStats are the cumulative statistics of outbox_events and the database.
type tableStats struct {
	seqScan, seqTupRead, idxScan, idxTupFetch, tupUpd, tupHotUpd, tupDel, xactCommit int64
}

func readTableStats(t *testing.T, pool *pgxpool.Pool, schema string) tableStats {
	t.Helper()
	var s tableStats
	// A fresh transaction sees the statistics flushed so far.
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(seq_scan, 0), coalesce(seq_tup_read, 0), coalesce(idx_scan, 0),
		coalesce(idx_tup_fetch, 0), n_tup_upd, n_tup_hot_upd, n_tup_del,
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox_events'`, schema).Scan(
		&s.seqScan, &s.seqTupRead, &s.idxScan, &s.idxTupFetch, &s.tupUpd, &s.tupHotUpd, &s.tupDel, &s.xactCommit); err != nil {
		t.Fatal(err)
	}
	return s
}

// claimPlan is what EXPLAIN (ANALYZE, BUFFERS) says about one claim.
type claimPlan struct {
	text       string
	buffers    int64 // shared blocks hit + read, whole statement
	rows       int   // events claimed
	execMillis float64
	seqScan    bool // a sequential scan of outbox_events
}

var (
	buffersRE = regexp.MustCompile(`Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?`)
	execRE    = regexp.MustCompile(`Execution Time: ([0-9.]+) ms`)
	rowsRE    = regexp.MustCompile(`actual time=\S+ rows=(\d+)`)
)

func explainClaim(t *testing.T, r *outbox.Relay) claimPlan {
	t.Helper()
	text, err := r.ExplainClaim(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return parsePlan(text)
}

// parsePlan reads the figures of a claim's EXPLAIN (ANALYZE, BUFFERS).
func parsePlan(text string) claimPlan {
	p := claimPlan{text: text, seqScan: strings.Contains(text, "Seq Scan on outbox_events")}
	if m := buffersRE.FindStringSubmatch(text); m != nil { // the first is the root's, children included
		hit, _ := strconv.ParseInt(m[1], 10, 64)
		read, _ := strconv.ParseInt(m[2], 10, 64)
		p.buffers = hit + read
	}
	if m := rowsRE.FindStringSubmatch(text); m != nil { // the root's
		p.rows, _ = strconv.Atoi(m[1])
	}
	if m := execRE.FindStringSubmatch(text); m != nil {
		p.execMillis, _ = strconv.ParseFloat(m[1], 64)
	}
	return p
}

// statementCounter counts the relay's statements by observing it.
type statementCounter struct{ claims, settles atomic.Int64 }

func (c *statementCounter) ObserveClaim(outbox.ClaimObservation)   { c.claims.Add(1) }
func (c *statementCounter) ObserveSettle(outbox.SettleObservation) { c.settles.Add(1) }

// both fans observations out to the metrics and the counter.
type both struct {
	*outboxprom.Metrics
	c *statementCounter
}

func (b both) ObserveClaim(o outbox.ClaimObservation) {
	b.Metrics.ObserveClaim(o)
	b.c.ObserveClaim(o)
}

func (b both) ObserveSettle(o outbox.SettleObservation) {
	b.Metrics.ObserveSettle(o)
	b.c.ObserveSettle(o)
}

// TestBacklogDrains builds a backlog while no relay runs (its events
// backdated ten minutes, as after a ten-minute outage), checks that the
// shipped oldest-age alert fires on the relay's metrics, starts a relay and
// lets it drain the backlog to a real NATS stream, then checks that every
// event arrived in per-aggregate order, the alert cleared, and that with
// published rows kept the claim uses the partial indexes (no sequential scan
// of outbox_events) and its cost does not grow when many more are added;
// finally the clean-up deletes that history in bounded batches without
// scanning the table. It reports drain rate, statements per second and rows
// read per event (from pg_stat_user_tables).
func TestBacklogDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := *backlogEvents
	aggs := *backlogAggregates
	if aggs == 0 {
		aggs = max(1, n/20)
	}
	pool, schema := outboxtest.Schema(t)
	js := natstest.JetStream(t, natstest.Conn(t))
	pub := natstest.Publisher(t, js, outboxnats.Config{})
	w := newWriter(t, schema)
	// Everything before the drain runs on setupPool, closed before the
	// drain: a backend flushes its statistics when it ends, so the drain's
	// deltas in pg_stat_user_tables are the relay's alone.
	setupPool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer setupPool.Close()

	// 1. The backlog, written by the writer in transactions of 1000 events.
	start := time.Now()
	const perTx = 1000
	for done := 0; done < n; done += perTx {
		err := pgx.BeginFunc(ctx, setupPool, func(tx pgx.Tx) error {
			evs := make([]outbox.Event, 0, perTx)
			for i := done; i < min(n, done+perTx); i++ {
				evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: "o" + strconv.Itoa(i%aggs), Type: "Step", Payload: []byte(`{"n":1}`)})
			}
			_, err := w.InsertTx(ctx, tx, evs...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	writeTook := time.Since(start)
	if _, err := setupPool.Exec(ctx, `UPDATE `+schema+`.outbox_events SET occurred_at = occurred_at - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	if _, err := setupPool.Exec(ctx, `VACUUM (ANALYZE) `+schema+`.outbox_events`); err != nil {
		t.Fatal(err)
	}

	// 2. The relay's metrics, and the oldest-age alert as shipped.
	var rule string
	groups, err := promrules.Load("deploy/prometheus/outbox-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert == "OutboxOldestPendingTooOld" {
				rule = r.Expr
			}
		}
	}
	// The relay's metrics; the scrape before the drain samples the database
	// through setupPool, the one after through pool.
	serve := func(db *pgxpool.Pool) (*outboxprom.Metrics, string) {
		m, err := outboxprom.New(outboxprom.Config{Schema: schema, Admin: newAdmin(t, db, schema), GaugesMaxAge: time.Nanosecond, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		srv := httptest.NewServer(outboxprom.Handler(reg, nil))
		t.Cleanup(srv.Close)
		return m, srv.URL
	}
	_, setupURL := serve(setupPool)
	metrics, url := serve(pool)
	relayPool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer relayPool.Close()
	counter := &statementCounter{}
	relay, err := outbox.NewRelay(relayPool, outbox.RelayConfig{Schema: schema, Publisher: pub, Observer: both{metrics, counter}, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	probe, err := outbox.NewRelay(setupPool, outbox.RelayConfig{Schema: schema, Publisher: pub, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	alert := func(url string) ([]promrules.Sample, float64) {
		t.Helper()
		fams, err := promrules.Scrape(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		firing, err := promrules.Eval(rule, fams)
		if err != nil {
			t.Fatal(err)
		}
		age, _ := promrules.Value(fams, "outbox_oldest_pending_age_seconds", map[string]string{"schema": schema})
		return firing, age
	}
	firing, ageBefore := alert(setupURL)
	if len(firing) != 1 {
		t.Fatalf("with a ten-minute-old backlog, %s evaluated to %v (age %gs); want it firing", rule, firing, ageBefore)
	}
	// Reported, not asserted: when the table holds nothing but the backlog,
	// a sequential scan of it may be the planner's cheapest choice.
	backlogPlan := explainClaim(t, probe)
	setupPool.Close()
	var before tableStats
	outboxtest.Eventually(t, 30*time.Second, "set-up statistics flushed", func() bool {
		before = readTableStats(t, pool, schema)
		return before.tupUpd >= int64(n+backlogPlan.rows) // the backdating, the explained claim
	})

	// 3. Drain.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start = time.Now()
	go func() { done <- relay.Run(runCtx) }()
	outboxtest.Eventually(t, 10*time.Minute, "backlog drained", func() bool { return relay.Stats().Published >= int64(n) })
	drain := time.Since(start)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	stats := relay.Stats()
	// The relay's connections flush their statistics when they end.
	relayPool.Close()
	var after tableStats
	outboxtest.Eventually(t, 30*time.Second, "relay statistics flushed", func() bool {
		after = readTableStats(t, pool, schema)
		return after.tupUpd-before.tupUpd >= 2*int64(n) // claim + mark per event
	})
	firingAfter, ageAfter := alert(url)
	if len(firingAfter) != 0 || ageAfter != 0 {
		t.Fatalf("after the drain the alert evaluates to %v (age %gs); want it cleared", firingAfter, ageAfter)
	}
	if stats.Published != int64(n) || stats.Failed != 0 || stats.LeaseConflicts != 0 {
		t.Fatalf("relay stats %+v: want exactly %d published, no failure, no conflict", stats, n)
	}

	// 4. Order at the broker: every event once, per aggregate 1, 2, 3, ...
	got := readStream(t, js, pub.Stream(), n)
	last := map[string]int64{}
	for _, m := range got {
		if m.Sequence != last[m.AggregateID]+1 {
			t.Fatalf("I5 violated: %s #%d reached the broker after #%d", m.AggregateID, m.Sequence, last[m.AggregateID])
		}
		last[m.AggregateID] = m.Sequence
	}
	if len(last) != aggs {
		t.Fatalf("%d aggregates at the broker, want %d", len(last), aggs)
	}

	// 5. The claim's cost with a tenth of the history, then with all of
	// it. The history lies in the same 500 aggregates as the pending events
	// (the realistic case: an order's old events), below them: sequences
	// 1..k are published, k+1 is pending; the small step publishes every
	// tenth of 1..k, the big one the rest. Same pending events, same plan,
	// same reads.
	const lanes = 500
	h := *backlogHistory
	k := max(10, h/lanes)
	if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_aggregates (aggregate_type, aggregate_id, last_sequence)
		SELECT 'order', 'lane-' || i, $1::bigint FROM generate_series(0, $2::int - 1) i`, k, lanes); err != nil {
		t.Fatal(err)
	}
	var fresh []outbox.Event
	for i := 0; i < lanes; i++ {
		fresh = append(fresh, outbox.Event{AggregateType: "order", AggregateID: "lane-" + strconv.Itoa(i), Type: "Step", Payload: []byte(`{"n":1}`)})
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, fresh...); return err }); err != nil {
		t.Fatal(err)
	}
	addHistory := func(tenth bool) claimPlan {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, published_at)
			SELECT gen_random_uuid(), 'order', 'lane-' || l, s, 'Old', '{"n":1}', now() - interval '1 day', now() - interval '1 day'
			FROM generate_series(0, $1::int - 1) l, generate_series(1, $2::int) s
			WHERE (s % 10 = 0) = $3`, lanes, k, tenth); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+schema+`.outbox_events`); err != nil {
			t.Fatal(err)
		}
		return explainClaim(t, probe)
	}
	probe, err = outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	small := addHistory(true)
	big := addHistory(false)
	var smallRows, bigRows = n + lanes*(k/10), n + lanes*k
	for _, p := range []claimPlan{small, big} {
		if p.seqScan {
			t.Fatalf("the claim scans outbox_events sequentially:\n%s", p.text)
		}
	}
	// B-tree depth may add a level to the per-event index probes: allow that,
	// not growth in proportion to the history.
	if big.rows != lanes || small.rows != lanes {
		t.Fatalf("the claims took %d and %d events, want the %d pending heads", small.rows, big.rows, lanes)
	}
	if big.buffers > small.buffers+small.buffers/2+20 {
		t.Fatalf("the claim of %d pending events read %d buffers with %d published rows kept, %d with %d: it grows with history\n%s\n%s",
			lanes, small.buffers, smallRows, big.buffers, bigRows, small.text, big.text)
	}
	var tableBytes int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, schema+".outbox_events").Scan(&tableBytes); err != nil {
		t.Fatal(err)
	}

	// 6. Clean-up of that history (published a day ago; the drained backlog
	// is inside the horizon and stays), on a pool of its own so that its
	// statistics are its own.
	cleanPool, err := pgxpool.New(ctx, outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer cleanPool.Close()
	cleanBefore := readTableStats(t, pool, schema)
	cleaned, err := newAdmin(t, cleanPool, schema).Cleanup(ctx, outbox.CleanupConfig{OlderThan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cleanPool.Close()
	var cleanAfter tableStats
	outboxtest.Eventually(t, 30*time.Second, "clean-up statistics flushed", func() bool {
		cleanAfter = readTableStats(t, pool, schema)
		return cleanAfter.tupDel-cleanBefore.tupDel >= cleaned.Events
	})
	if cleaned.Events != int64(lanes*k) || cleanAfter.seqScan != cleanBefore.seqScan {
		t.Fatalf("clean-up deleted %d events (want the %d of the history) with %d sequential scans of outbox_events (want none)",
			cleaned.Events, lanes*k, cleanAfter.seqScan-cleanBefore.seqScan)
	}
	if left := unpublished(t, pool, schema); left != lanes {
		t.Fatalf("%d unpublished events after the clean-up, want the %d pending heads untouched", left, lanes)
	}

	statements := counter.claims.Load() + counter.settles.Load()
	rowsRead := (after.seqTupRead - before.seqTupRead) + (after.idxTupFetch - before.idxTupFetch)
	report := fmt.Sprintf(`| figure | value |
|---|---|
| backlog | %d events over %d aggregates (written in %s, %.0f events/s) |
| oldest pending age before the drain | %.0f s: OutboxOldestPendingTooOld fires |
| drain | %s, %.0f events/s, relay batch size %d |
| relay statements | %d claims + %d write-backs = %.0f statements/s (%.4f per event) |
| database commits during the drain (whole server: the relay's statements, heartbeats and anything else running) | %d, %.0f/s |
| outbox_events rows read | %d (%.2f per event): %d by %d sequential scans, %d index fetches by %d index scans |
| outbox_events row updates | %d (%.2f per event; %d HOT) |
| order at the broker | %d events, every aggregate 1, 2, 3, … without gap or repeat |
| oldest pending age after the drain | %.0f s: the alert cleared |
| claim with the whole backlog pending (nothing published kept) | %d buffers, %.2f ms, sequential scan of outbox_events: %v |
| claim of %d pending heads, %d published rows kept (%d in their own aggregates) | %d buffers, %.2f ms, no sequential scan |
| claim of %d pending heads, %d published rows kept (%d in their own aggregates) | %d buffers, %.2f ms, no sequential scan |
| outbox_events size before clean-up | %.1f MiB |
| clean-up of the %d-row history | %s in %d batches of 1000, %.0f rows/s, %d rows read by sequential scans, %.2f index fetches per deleted row |
`,
		n, aggs, writeTook.Round(time.Millisecond), float64(n)/writeTook.Seconds(),
		ageBefore,
		drain.Round(time.Millisecond), float64(n)/drain.Seconds(), outbox.BatchSizeDefault,
		counter.claims.Load(), counter.settles.Load(), float64(statements)/drain.Seconds(), float64(statements)/float64(n),
		after.xactCommit-before.xactCommit, float64(after.xactCommit-before.xactCommit)/drain.Seconds(),
		rowsRead, float64(rowsRead)/float64(n), after.seqTupRead-before.seqTupRead, after.seqScan-before.seqScan,
		after.idxTupFetch-before.idxTupFetch, after.idxScan-before.idxScan,
		after.tupUpd-before.tupUpd, float64(after.tupUpd-before.tupUpd)/float64(n), after.tupHotUpd-before.tupHotUpd,
		len(got),
		ageAfter,
		backlogPlan.buffers, backlogPlan.execMillis, backlogPlan.seqScan,
		lanes, smallRows, lanes*(k/10), small.buffers, small.execMillis,
		lanes, bigRows, lanes*k, big.buffers, big.execMillis,
		float64(tableBytes)/(1<<20),
		cleaned.Events, cleaned.Duration.Round(time.Millisecond), cleaned.Batches, float64(cleaned.Events)/cleaned.Duration.Seconds(),
		cleanAfter.seqTupRead-cleanBefore.seqTupRead, float64(cleanAfter.idxTupFetch-cleanBefore.idxTupFetch)/float64(max(1, cleaned.Events)))
	t.Logf("backlog figures:\n%s\nclaim plan with %d published rows kept:\n%s", report, bigRows, big.text)
	if *backlogReport != "" {
		if err := os.WriteFile(*backlogReport, []byte(report+"\nClaim plan with "+strconv.Itoa(bigRows)+" published rows kept:\n\n```\n"+big.text+"```\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readStream reads n messages of a stream in order with an ordered consumer.
func readStream(t *testing.T, js jetstream.JetStream, stream string, n int) []outbox.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]outbox.Message, 0, n)
	for len(out) < n {
		batch, err := cons.Fetch(min(1000, n-len(out)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for msg := range batch.Messages() {
			m, err := outboxnats.Decode(msg.Headers(), msg.Data())
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
		if got == 0 {
			t.Fatalf("stream %s ended after %d of %d messages", stream, len(out), n)
		}
	}
	return out
}
