package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
)

var (
	buildMu   sync.Mutex
	builds    = map[string]Binaries{} // by build tags
	buildErrs = map[string]error{}
	buildDir  string
)

func TestMain(m *testing.M) {
	// The race-built processes the tests start and stop exit without the
	// race runtime's second of sleep at a clean exit.
	outboxtest.NoRaceExitSleep()
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// testBinaries builds the outbox and orders binaries once per test run (per
// set of build tags), with -race when the tests run with it.
func testBinaries(t *testing.T, tags ...string) Binaries {
	t.Helper()
	key := strings.Join(tags, ",")
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := builds[key]; ok {
		return b
	}
	if err, ok := buildErrs[key]; ok {
		t.Fatal(err)
	}
	if buildDir == "" {
		d, err := os.MkdirTemp("", "outbox-chaos-bin-")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = d
	}
	wd, _ := os.Getwd()
	root, err := ModuleRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(buildDir, "default")
	if key != "" {
		dir = filepath.Join(buildDir, strings.ReplaceAll(key, ",", "_"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	b, err := Build(ctx, root, dir, raceEnabled, tags...)
	if err != nil {
		buildErrs[key] = err
		t.Fatal(err)
	}
	t.Logf("built %s and %s (race %v, tags %q) in %s", b.Outbox, b.Orders, raceEnabled, key, time.Since(start).Round(time.Millisecond))
	builds[key] = b
	return b
}

// logSink sends the processes' lines to the test log.
func logSink(t *testing.T) Sink {
	var mu sync.Mutex
	done := false
	t.Cleanup(func() { mu.Lock(); done = true; mu.Unlock() })
	return func(name, line string) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Logf("%-12s| %s", name, line)
		}
	}
}

// envOptions shape a test's system.
type envOptions struct {
	relays, consumers int
	lease             time.Duration
	// dest is the destination: a URL, or a kind ("kafka") for one of the
	// test's own (default: the machine's NATS server).
	dest string
	// databaseURL and pool are the database (default: the machine's).
	databaseURL string
	pool        *pgxpool.Pool
	schema      string // migrated in pool
}

// env is one test's order system: its own schema, stream and subject
// prefix, and its processes, all killed when the test ends.
type env struct {
	t     *testing.T
	pool  *pgxpool.Pool
	where Where
	dest  Destination
	sys   *System
	seed  uint64
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	if o.dest == "" {
		o.dest = outboxtest.NATSURL()
	}
	if o.lease == 0 {
		o.lease = time.Second
	}
	var pool *pgxpool.Pool
	var schema string
	if o.pool == nil {
		pool, schema = outboxtest.Schema(t)
		o.databaseURL = outboxtest.DatabaseURL()
	} else {
		pool, schema = o.pool, o.schema
	}
	name := outboxtest.UniqueName(t, "c")
	w := Where{Schema: schema}
	// A short deduplication window, so a republished event really reaches
	// the stream twice and the consumers have duplicates to suppress.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dest, err := OpenDestination(ctx, DestinationConfig{Spec: o.dest, Tag: name, DuplicateWindow: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dest.Close(false); err != nil {
			t.Error(err)
		}
	})
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	sys := NewSystem(SystemConfig{
		Bins: testBinaries(t), DatabaseURL: o.databaseURL, Schema: schema,
		Destination: dest, APIPort: port,
		Relays: o.relays, Consumers: o.consumers, Lease: o.lease, AckWait: 2 * time.Second,
		Sink: logSink(t),
	})
	t.Cleanup(sys.KillAll) // registered after the stream's deletion: runs first
	return &env{t: t, pool: pool, where: w, dest: dest, sys: sys, seed: 1}
}

func (e *env) start(name, failpoints string) {
	e.t.Helper()
	if err := e.sys.Start(name, failpoints, e.seed); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) startAll(failpoints map[string]string, except ...string) {
	e.t.Helper()
	for _, n := range e.sys.Names() {
		skip := false
		for _, x := range except {
			skip = skip || x == n
		}
		if !skip {
			e.start(n, failpoints[n])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.sys.WaitAPI(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// driver returns a driver on the test's API that sends every create with
// an Idempotency-Key, so every ambiguous answer is settled by a retry.
func (e *env) driver() *Driver {
	d := NewDriver(e.sys.APIURL(), fmt.Sprintf("%d", time.Now().UnixNano()%1e9), e.seed,
		Mix{RollbackPercent: 10, CancelPercent: 25, CancelAgainPercent: 5, KeyedPercent: 100, ResendPercent: 20})
	e.t.Cleanup(d.Close)
	return d
}

// waitExit waits until incarnation inc of member name has ended and
// returns how.
func (e *env) waitExit(name string, inc int, timeout time.Duration) Exit {
	e.t.Helper()
	var got Exit
	outboxtest.Eventually(e.t, timeout, fmt.Sprintf("%s#%d ended", name, inc), func() bool {
		for _, x := range e.sys.Exits() {
			if x.Member == name && x.Incarnation == inc {
				got = x
				return true
			}
		}
		return false
	})
	return got
}

// expectCrash waits for incarnation inc of name to die of SIGKILL at the
// crash failpoint fp, not by the harness's hand.
func (e *env) expectCrash(name string, inc int, fp string) {
	e.t.Helper()
	x := e.waitExit(name, inc, 90*time.Second)
	if x.Signal != syscall.SIGKILL || x.ByHarness || x.Failpoint != fp {
		e.t.Fatalf("%s#%d ended with signal %v (by harness %v, failpoint %q, err %v); want SIGKILL by failpoint %s",
			name, inc, x.Signal, x.ByHarness, x.Failpoint, x.Err, fp)
	}
}

// converge waits until everything committed was published and applied,
// resolves the ledger and checks the invariants; it fails the test on any
// violation.
func (e *env) converge(d *Driver) *Report {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var since time.Time
	if err := e.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since); err != nil {
		e.t.Fatal(err)
	}
	if err := WaitWritesEnded(ctx, e.pool, e.sys.AppName(RoleAPI), since); err != nil {
		e.t.Fatal(err)
	}
	if p, err := WaitConverged(ctx, e.pool, e.dest, e.where); err != nil {
		e.t.Fatalf("%v", err)
	} else {
		e.t.Logf("converged: %s", p)
	}
	if err := d.Ledger.Resolve(ctx, e.pool, e.where.Schema); err != nil {
		e.t.Fatal(err)
	}
	r, err := Check(ctx, e.pool, e.dest, e.where, d.Ledger, e.countLines("consumer-", "cancellation found no reservation"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("commands %d (commits %d, rollbacks %d, replays %d, ambiguous %d), events %d, stream messages %d (duplicates %d), deliveries %d",
		r.Commands, r.Commits, r.Rollbacks, r.Replays, r.Ambiguous, r.Events, r.StreamMessages, r.DuplicatesPublished, r.Deliveries)
	if err := r.Err(); err != nil {
		e.t.Fatalf("invariants violated:\n%v", err)
	}
	if r.Commits == 0 || r.Events == 0 {
		e.t.Fatal("nothing was committed")
	}
	return r
}

// countLines counts the lines containing s written by every incarnation of
// the members whose name starts with prefix so far.
func (e *env) countLines(prefix, s string) int {
	n := 0
	for _, p := range e.procs(prefix) {
		n += p.CountLines(s)
	}
	return n
}

// procs returns every incarnation's process of the members starting with
// prefix.
func (e *env) procs(prefix string) []*Process {
	return e.sys.History(prefix)
}

// queryInt runs a count query on the test's schema ({s} is replaced by it).
func (e *env) queryInt(sql string) int64 {
	e.t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), strings.ReplaceAll(sql, "{s}", e.where.Schema)).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) streamCount() int64 {
	e.t.Helper()
	msgs, err := e.dest.Messages(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return int64(len(msgs))
}
