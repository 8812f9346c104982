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

// transactions is the database's committed and rolled-back transactions so
// far (pg_stat_database; backends report at most once a second, and an idle
// one within about ten).
func transactions(t *testing.T, admin *pgxpool.Pool, dbURL string) int64 {
	t.Helper()
	u, _ := url.Parse(dbURL)
	var n int64
	if err := admin.QueryRow(context.Background(), `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`,
		strings.TrimPrefix(u.Path, "/")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
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
func TestFleetFigureIdle(t *testing.T) {
	n := envInt("OUTBOX_FLEET_SOURCES", 200)
	warm, window := envDuration("OUTBOX_FLEET_WARMUP", 2*time.Minute), envDuration("OUTBOX_FLEET_WINDOW", time.Minute)
	admin := outboxtest.Pool(t)
	dbURL, pool := outboxtest.Database(t, admin)
	var schemas []string
	for i := 0; i < n; i++ {
		schemas = append(schemas, fmt.Sprintf("tenant_%03d", i))
	}
	migrateSchemas(t, pool, schemas...)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
databases:
  main: {url: %q}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: main, schema_pattern: "tenant_*", destination: events}
`, dbURL)))
	if err != nil {
		t.Fatal(err)
	}
	f := runFleet(t, cfg, outboxfleet.Options{OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub})})
	waitFor(t, 5*time.Minute, "every source running", func() bool { return len(running(f)) == n })
	started := time.Now()
	time.Sleep(warm) // the figure is the cost after this much idle time, not a synchronisation
	before, from := transactions(t, admin, dbURL), time.Now()
	time.Sleep(window)
	after, to := transactions(t, admin, dbURL), time.Now()
	rate := float64(after-before) / to.Sub(from).Seconds()
	t.Logf("FIGURE fleet idle: %d sources in one database, idle %s..%s: %.2f transactions/s (%d in %s); RSS of the test process %.0f MB",
		n, from.Sub(started).Round(time.Second), to.Sub(started).Round(time.Second), rate, after-before, to.Sub(from).Round(time.Second), rssMB(t))
	if rate > 5 {
		t.Errorf("%.2f transactions/s for %d idle sources: want at most 5", rate, n)
	}
}

// commitToAck records one source's commit-to-acknowledgement latencies,
// passing every observation on to the fleet's observer.
type commitToAck struct {
	next any
	mu   sync.Mutex
	lat  []time.Duration
	on   bool
}

func (c *commitToAck) ObservePublish(o outbox.PublishObservation) {
	if o.Err == nil {
		c.mu.Lock()
		if c.on {
			c.lat = append(c.lat, o.CommitToAck)
		}
		c.mu.Unlock()
	}
	c.next.(outbox.PublishObserver).ObservePublish(o)
}
func (c *commitToAck) ObserveClaim(o outbox.ClaimObservation) {
	c.next.(outbox.ClaimObserver).ObserveClaim(o)
}

// measure clears the latencies and records from now on.
func (c *commitToAck) measure() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lat, c.on = nil, true
}

// p99 of what was recorded since measure, and how many.
func (c *commitToAck) p99() (time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := append([]time.Duration(nil), c.lat...)
	if len(l) == 0 {
		return 0, 0
	}
	slices.Sort(l)
	return l[(len(l)*99)/100], len(l)
}

// TestFleetFigureIsolation: a backlog of OUTBOX_FLEET_BACKLOG (200,000)
// events in one source while another takes 100 events/s (each committed
// alone, its writer notifying), beside OUTBOX_FLEET_IDLE_SOURCES (198) idle
// sources of the same database: the second source's p99 commit-to-ack, alone
// and during the backlog. Targets: at most 50 ms, and at most twice its p99
// alone.
func TestFleetFigureIsolation(t *testing.T) {
	backlog := envInt("OUTBOX_FLEET_BACKLOG", 200000)
	idle := envInt("OUTBOX_FLEET_IDLE_SOURCES", 198)
	phase := envDuration("OUTBOX_FLEET_PHASE", 20*time.Second)
	ctx := context.Background()
	admin := outboxtest.Pool(t)
	dbURL, pool := outboxtest.Database(t, admin)
	schemas := []string{"busy", "steady"}
	for i := 0; i < idle; i++ {
		schemas = append(schemas, fmt.Sprintf("idle_%03d", i))
	}
	migrateSchemas(t, pool, schemas...)
	st := newStream(t)
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
databases:
  main: {url: %q}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: main, schema_pattern: "*", destination: events}
`, dbURL)))
	if err != nil {
		t.Fatal(err)
	}
	lat := &commitToAck{}
	f := runFleet(t, cfg, outboxfleet.Options{
		OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub}),
		ConfigureRelay: func(source string, rc *outbox.RelayConfig) {
			if source == "main/steady" {
				lat.next = rc.Observer
				rc.Observer = lat
			}
		},
	})
	waitFor(t, 5*time.Minute, "every source running", func() bool { return len(running(f)) == len(schemas) })
	// The 200 sources' start-up (each relay's first heartbeat, durability
	// check, lane sweep and full scan) fills the pool for a while: the
	// figure is of a fleet that runs, not of one starting.
	time.Sleep(envDuration("OUTBOX_FLEET_WARMUP", 30*time.Second))

	steady := func(d time.Duration) {
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
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("s-%d", i%50), Type: "Tick", Payload: []byte(`{}`)})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			nt.Notify()
		}
	}
	lat.measure()
	steady(phase)
	alone, n1 := lat.p99()

	var bw written
	bw.write(t, pool, "busy", "order", 1000, backlog/1000)
	lat.measure()
	steady(phase)
	during, n2 := lat.p99()
	left := unpublishedIn(t, pool, "busy")
	t.Logf("FIGURE fleet isolation: %d sources; steady source p99 commit-to-ack alone %s (%d events), during a %d-event backlog in another source %s (%d events; %d of the backlog still pending at the end); RSS %.0f MB",
		len(schemas), alone.Round(time.Millisecond), n1, backlog, during.Round(time.Millisecond), n2, left, rssMB(t))
	if left == 0 {
		t.Logf("the backlog drained before the phase ended: make OUTBOX_FLEET_BACKLOG larger for a fair figure")
	}
	if during > 50*time.Millisecond || during > 2*max(alone, 5*time.Millisecond) {
		t.Errorf("p99 during the backlog %s: want at most 50ms and at most twice %s", during, alone)
	}
}
