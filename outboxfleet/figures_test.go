//go:build fleetfigures

package outboxfleet_test

// The many-outboxes figures (BENCHMARKS.md): `make bench-fleet`, or
//
//	go test -tags fleetfigures -run 'TestFleetFigure' -v ./outboxfleet/
//
// They take minutes (the idle figure waits for the sources' upkeep to back
// off): a benchmark, built only with the fleetfigures tag, never a test
// the suite skips.

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxfleet"
)

func envInt(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(key string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(key)); err == nil && v > 0 {
		return v
	}
	return def
}

// dbName is the database a connection URL names.
func dbName(dbURL string) string {
	u, _ := url.Parse(dbURL)
	return strings.TrimPrefix(u.Path, "/")
}

// transactions is the database's committed and rolled-back transactions so
// far (pg_stat_database; backends report at most once a second, and an idle
// one within about ten).
func transactions(t *testing.T, admin *pgxpool.Pool, dbURL string) int64 {
	t.Helper()
	var n int64
	if err := admin.QueryRow(context.Background(), `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`,
		dbName(dbURL)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// loadAvg is the machine's load averages over 1, 5 and 15 minutes: the
// figures are taken on a shared machine, and say how shared.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func rssMB(t *testing.T) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			kb, _ := strconv.Atoi(strings.Fields(line)[1])
			return float64(kb) / 1024
		}
	}
	return 0
}

// TestFleetFigureIdle: OUTBOX_FLEET_SOURCES (200) idle schemas in one
// database under one fleet with the default settings: the database's
// transactions per second (every statement of the fleet is a transaction of
// its own) over OUTBOX_FLEET_WINDOW (60 s), after the sources have been idle
// for OUTBOX_FLEET_WARMUP (120 s). Target: at most 5 per second.
func TestFleetFigureIdle(t *testing.T) { figureIdle(t, 1) }

// TestFleetFigureIdleThreeDatabases: the same 200 sources spread over 3
// databases under one fleet (a pool, a listener and a look each): the
// transactions per second of the three together.
func TestFleetFigureIdleThreeDatabases(t *testing.T) { figureIdle(t, 3) }

// figureDatabases makes ndb databases of the test's own (outboxtest.Database)
// and the fleet configuration's databases section naming them db0, db1...
func figureDatabases(t *testing.T, admin *pgxpool.Pool, ndb int) (urls []string, pools []*pgxpool.Pool, yaml string) {
	var b strings.Builder
	for i := 0; i < ndb; i++ {
		u, p := outboxtest.Database(t, admin)
		urls, pools = append(urls, u), append(pools, p)
		fmt.Fprintf(&b, "  db%d: {url: %q}\n", i, u)
	}
	return urls, pools, b.String()
}

func figureIdle(t *testing.T, ndb int) {
	n := envInt("OUTBOX_FLEET_SOURCES", 200)
	warm, window := envDuration("OUTBOX_FLEET_WARMUP", 2*time.Minute), envDuration("OUTBOX_FLEET_WINDOW", time.Minute)
	admin := outboxtest.Pool(t)
	urls, pools, dbs := figureDatabases(t, admin, ndb)
	var sources strings.Builder
	for d := 0; d < ndb; d++ {
		var schemas []string
		for i := d; i < n; i += ndb { // tenant_000 in db0, tenant_001 in db1, ...
			schemas = append(schemas, fmt.Sprintf("tenant_%03d", i))
		}
		migrateSchemas(t, pools[d], schemas...)
		fmt.Fprintf(&sources, "  - {database: db%d, schema_pattern: \"tenant_*\", destination: events}\n", d)
	}
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
databases:
%s
destinations:
  events: {url: "nats://unused"}
sources:
%s`, dbs, sources.String())))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 5*time.Minute, "every source running", func() bool { return len(running(f)) == n })
	total := func() int64 {
		var sum int64
		for _, u := range urls {
			sum += transactions(t, admin, u)
		}
		return sum
	}
	started := time.Now()
	time.Sleep(warm) // the figure is the cost after this much idle time, not a synchronisation
	before, from := total(), time.Now()
	seen := sampleStatements(t, admin, urls, window)
	after, to := total(), time.Now()
	rate := float64(after-before) / to.Sub(from).Seconds()
	t.Logf("FIGURE fleet idle: %d sources in %d database(s), idle %s..%s: %.2f transactions/s (%d in %s); RSS of the test process %.0f MB",
		n, ndb, from.Sub(started).Round(time.Second), to.Sub(started).Round(time.Second), rate, after-before, to.Sub(from).Round(time.Second), rssMB(t))
	t.Logf("statements seen in the window (pg_stat_activity every 20 ms; a statement shorter than that may be missed):\n%s", seen)
	if rate > 5 {
		t.Errorf("%.2f transactions/s for %d idle sources: want at most 5", rate, n)
	}
}

// sampleStatements watches pg_stat_activity in the databases of urls for
// window, every 20 ms, and returns how many statements of each kind began
// (a backend's query_start changing), by their first line: where an idle
// fleet's transactions go.
func sampleStatements(t *testing.T, admin *pgxpool.Pool, urls []string, window time.Duration) string {
	t.Helper()
	var names []string
	for _, u := range urls {
		names = append(names, dbName(u))
	}
	type key struct {
		pid   int32
		start time.Time
	}
	counted := map[key]bool{}
	kinds := map[string]int{}
	ctx := context.Background()
	first := true // what ran before the window is counted as seen, not as a statement of it
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		rows, err := admin.Query(ctx, `SELECT pid, query_start, query FROM pg_stat_activity
			WHERE datname = ANY($1) AND query_start IS NOT NULL AND pid <> pg_backend_pid()`, names)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k key
			var q string
			if err := rows.Scan(&k.pid, &k.start, &q); err != nil {
				t.Fatal(err)
			}
			if counted[k] {
				continue
			}
			counted[k] = true
			if first {
				continue
			}
			q = strings.Join(strings.Fields(q), " ")
			if len(q) > 110 {
				q = q[:110]
			}
			kinds[q]++
		}
		rows.Close()
		first = false
	}
	type kc struct {
		q string
		n int
	}
	var list []kc
	for q, n := range kinds {
		list = append(list, kc{q, n})
	}
	slices.SortFunc(list, func(a, b kc) int { return b.n - a.n })
	var b strings.Builder
	for _, e := range list {
		fmt.Fprintf(&b, "%6d  %s\n", e.n, e.q)
	}
	return b.String()
}

// holdersDuring samples, every 20 ms until the returned function is called,
// the backends of the database at dbURL that are not idle, and the
// function reports how many samples found each kind (state, the schema its
// statement names, its first words) and the most found at once: which
// statements hold the connections a backlog's neighbours wait for; and,
// beside, how many of the fleet's pool for that database were acquired at
// each sample (a connection acquired but idle on the server is held by the
// fleet between statements).
func holdersDuring(t *testing.T, admin *pgxpool.Pool, dbURL string, fleetPool *pgxpool.Pool) func() string {
	t.Helper()
	name := dbName(dbURL)
	ctx, cancel := context.WithCancel(context.Background())
	kinds := map[string]int{}
	samples, most := 0, 0
	acquired := map[int32]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rows, err := admin.Query(ctx, `SELECT state, query FROM pg_stat_activity
				WHERE datname = $1 AND state IS NOT NULL AND state <> 'idle' AND pid <> pg_backend_pid()`, name)
			if err != nil {
				return
			}
			n := 0
			acquired[fleetPool.Stat().AcquiredConns()]++
			for rows.Next() {
				var state, q string
				if rows.Scan(&state, &q) != nil {
					break
				}
				n++
				schema := "?"
				for _, sc := range []string{"busy", "steady", "idle_"} {
					if strings.Contains(q, `"`+sc) || strings.Contains(q, sc+".") {
						schema = strings.TrimSuffix(sc, "_")
						break
					}
				}
				q = strings.Join(strings.Fields(q), " ")
				if len(q) > 70 {
					q = q[:70]
				}
				kinds[fmt.Sprintf("%-19s %-6s %s", state, schema, q)]++
			}
			rows.Close()
			samples++
			most = max(most, n)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() string {
		cancel()
		<-done
		type kc struct {
			k string
			n int
		}
		var list []kc
		for k, n := range kinds {
			list = append(list, kc{k, n})
		}
		slices.SortFunc(list, func(a, b kc) int { return b.n - a.n })
		var b strings.Builder
		fmt.Fprintf(&b, "%d samples, at most %d backends not idle at once; the fleet's pool's acquired connections (of %d) per sample:", samples, most, fleetPool.Stat().MaxConns())
		for n := int32(0); n <= fleetPool.Stat().MaxConns(); n++ {
			fmt.Fprintf(&b, " %d: %d", n, acquired[n])
		}
		b.WriteString("; per kind, the samples that found it:\n")
		for i, e := range list {
			if i == 15 {
				break
			}
			fmt.Fprintf(&b, "%6d  %s\n", e.n, e.k)
		}
		return b.String()
	}
}

// commitToAck records one source's commit-to-acknowledgement latencies,
// passing every observation on to the fleet's observer.
type commitToAck struct {
	next any
	mu   sync.Mutex
	lat  []time.Duration
	// Where the time goes: the source's claims that took events (their
	// round trip, waiting for a pool connection included) and its
	// publishes' acknowledgement latencies.
	claims, acks []time.Duration
	on           bool
}

func (c *commitToAck) ObservePublish(o outbox.PublishObservation) {
	if o.Err == nil {
		c.mu.Lock()
		if c.on {
			c.lat = append(c.lat, o.CommitToAck)
			c.acks = append(c.acks, o.AckLatency)
		}
		c.mu.Unlock()
	}
	c.next.(outbox.PublishObserver).ObservePublish(o)
}
func (c *commitToAck) ObserveClaim(o outbox.ClaimObservation) {
	if o.Err == nil && o.Events > 0 && !o.FullScan {
		c.mu.Lock()
		if c.on {
			c.claims = append(c.claims, o.Duration)
		}
		c.mu.Unlock()
	}
	c.next.(outbox.ClaimObserver).ObserveClaim(o)
}

// measure clears the latencies and records from now on.
func (c *commitToAck) measure() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lat, c.claims, c.acks, c.on = nil, nil, nil, true
}

// p99 of what was recorded since measure, and how many.
func (c *commitToAck) p99() (time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return percentile(c.lat, 99), len(c.lat)
}

// breakdown says where the time went since measure: the p50 and p99 of
// commit-to-ack, of the claims' round trips and of the acknowledgements.
func (c *commitToAck) breakdown() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("commit-to-ack p50 %s p99 %s; claim round trip p50 %s p99 %s (%d claims); ack p50 %s p99 %s",
		percentile(c.lat, 50), percentile(c.lat, 99), percentile(c.claims, 50), percentile(c.claims, 99), len(c.claims),
		percentile(c.acks, 50), percentile(c.acks, 99))
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	l := slices.Clone(d)
	slices.Sort(l)
	return l[(len(l)*p)/100].Round(100 * time.Microsecond)
}

// poolWait says how the pool's connections were waited for between two
// of its Stats.
func poolWait(before, after *pgxpool.Stat) string {
	n := after.AcquireCount() - before.AcquireCount()
	waited := after.EmptyAcquireCount() - before.EmptyAcquireCount()
	d := after.AcquireDuration() - before.AcquireDuration()
	var mean time.Duration
	if n > 0 {
		mean = d / time.Duration(n)
	}
	return fmt.Sprintf("pool: %d acquires, %d waited for a connection, mean acquire %s", n, waited, mean.Round(10*time.Microsecond))
}

// TestFleetFigureIsolation: a backlog of OUTBOX_FLEET_BACKLOG (200,000)
// events in one source while another takes 100 events/s (each committed
// alone, its writer notifying), beside OUTBOX_FLEET_IDLE_SOURCES (198) idle
// sources of the same database: the second source's p99 commit-to-ack, alone
// and during the backlog. Targets: at most 50 ms, and at most twice its p99
// alone.
func TestFleetFigureIsolation(t *testing.T) { figureIsolation(t, 1) }

// TestFleetFigureIsolationThreeDatabases: the same over 3 databases under
// one fleet, the backlog in the first, the steady source in the last, the
// idle sources spread over the three: what the sources of one database
// share with another's is the process and the destination.
func TestFleetFigureIsolationThreeDatabases(t *testing.T) { figureIsolation(t, 3) }

func figureIsolation(t *testing.T, ndb int) {
	backlog := envInt("OUTBOX_FLEET_BACKLOG", 200000)
	idle := envInt("OUTBOX_FLEET_IDLE_SOURCES", 198)
	phase := envDuration("OUTBOX_FLEET_PHASE", 20*time.Second)
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	urls, pools, dbs := figureDatabases(t, admin, ndb)
	busyDB, steadyDB := 0, ndb-1
	schemas := make([][]string, ndb)
	schemas[busyDB] = append(schemas[busyDB], "busy")
	schemas[steadyDB] = append(schemas[steadyDB], "steady")
	for i := 0; i < idle; i++ {
		schemas[i%ndb] = append(schemas[i%ndb], fmt.Sprintf("idle_%03d", i))
	}
	var sources strings.Builder
	for d := 0; d < ndb; d++ {
		migrateSchemas(t, pools[d], schemas[d]...)
		fmt.Fprintf(&sources, "  - {database: db%d, schema_pattern: \"*\", destination: events}\n", d)
	}
	pool := pools[steadyDB]
	st := newStream(t)
	relay := "{}" // the defaults; OUTBOX_FLEET_BATCH_SIZE sets batch_size
	if n := envInt("OUTBOX_FLEET_BATCH_SIZE", 0); n > 0 {
		relay = fmt.Sprintf("{batch_size: %d}", n)
	}
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: %s
databases:
%s
destinations:
  events: {url: "nats://unused"}
sources:
%s`, relay, dbs, sources.String())))
	if err != nil {
		t.Fatal(err)
	}
	lat := &commitToAck{}
	f := runFleet(t, cfg, outboxfleet.Options{
		OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub}),
		ConfigureRelay: func(source string, rc *outbox.RelayConfig) {
			if strings.HasSuffix(source, "/steady") {
				lat.next = rc.Observer
				rc.Observer = lat
			}
		},
	})
	waitFor(t, 5*time.Minute, "every source running", func() bool { return len(running(f)) == idle+2 })
	// The 200 sources' start-up (each relay's first heartbeat, durability
	// check, lane sweep and full scan) fills the pool for a while: the
	// figure is of a fleet that runs, not of one starting.
	time.Sleep(envDuration("OUTBOX_FLEET_WARMUP", 30*time.Second))

	// The writer's transactions: commit-to-ack counts from their start.
	var txs []time.Duration
	steady := func(d time.Duration) {
		txs = txs[:0]
		w, err := outbox.NewWriter(outbox.WriterConfig{Schema: "steady"})
		if err != nil {
			t.Fatal(err)
		}
		nt, err := outbox.NewNotifier(pool, outbox.NotifierConfig{Schema: "steady", Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer nt.Close()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for end, i := time.Now().Add(d), 0; time.Now().Before(end); i++ {
			<-tick.C
			txStart := time.Now()
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("s-%d", i%50), Type: "Tick", Payload: []byte(`{}`)})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			txs = append(txs, time.Since(txStart))
			nt.Notify()
		}
	}
	fleetPool := f.Pool(fmt.Sprintf("db%d", steadyDB))
	s0 := fleetPool.Stat()
	lat.measure()
	steady(phase)
	alone, n1 := lat.p99()
	s1 := fleetPool.Stat()
	t.Logf("alone: %s; writer's transaction p50 %s p99 %s; %s; load %s", lat.breakdown(), percentile(txs, 50), percentile(txs, 99), poolWait(s0, s1), loadAvg())

	// The backlog is committed at once (one transaction): written round by
	// round, it drained as fast as a loaded machine wrote it, and there was
	// no backlog to measure beside. It is written by one INSERT ... SELECT
	// of the rows the writer would store (a UUIDv7 id, each event an
	// aggregate of its own at sequence 1, available_at = occurred_at, the
	// transaction's dispatch_xid), with their counter rows: the figure is
	// the drain's, not the write's. Through the writer, 200 calls of 1,000
	// events in one transaction cost a pass over the aggregates the
	// transaction holds per call (migration 019; before it, a pass per
	// aggregate, and this took over ten minutes): minutes on this machine.
	wrote := time.Now()
	if err := pgx.BeginFunc(ctx, pools[busyDB], func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO busy.outbox_aggregates (aggregate_type, aggregate_id, last_sequence)
			SELECT 'order', format('busy-%s', lpad(i::text, 9, '0')), 1 FROM generate_series(1, $1::int) i`, backlog); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO busy.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload_bytes)
			SELECT busy.new_event_id(), 'order', format('busy-%s', lpad(i::text, 9, '0')), 1, 'Step', '{}'::bytea
			FROM generate_series(1, $1::int) i ORDER BY i`, backlog)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the backlog of %d events written and committed in one transaction in %s (load %s)", backlog, time.Since(wrote).Round(time.Second), loadAvg())
	s2 := fleetPool.Stat()
	held := holdersDuring(t, admin, urls[busyDB], f.Pool(fmt.Sprintf("db%d", busyDB)))
	lat.measure()
	steady(phase)
	during, n2 := lat.p99()
	t.Logf("during the backlog: %s; writer's transaction p50 %s p99 %s; %s; load %s", lat.breakdown(), percentile(txs, 50), percentile(txs, 99), poolWait(s2, fleetPool.Stat()), loadAvg())
	t.Logf("the busy source's database's backends not idle during the backlog (pg_stat_activity every 20 ms):\n%s", held())
	left := unpublishedIn(t, pools[busyDB], "busy")
	t.Logf("FIGURE fleet isolation: %d sources in %d database(s); steady source p99 commit-to-ack alone %s (%d events), during a %d-event backlog in another source %s (%d events; %d of the backlog still pending at the end); RSS %.0f MB",
		idle+2, ndb, alone.Round(time.Millisecond), n1, backlog, during.Round(time.Millisecond), n2, left, rssMB(t))
	if left == 0 {
		t.Logf("the backlog drained before the phase ended: make OUTBOX_FLEET_BACKLOG larger for a fair figure")
	}
	if during > 50*time.Millisecond || during > 2*max(alone, 5*time.Millisecond) {
		t.Errorf("p99 during the backlog %s: want at most 50ms and at most twice %s", during, alone)
	}
}
