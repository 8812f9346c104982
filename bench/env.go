package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/outboxmigrate"
	"github.com/pgoutbox/outbox/outboxnats"
)

// env is what every scenario shares: the servers and the run's unique id.
type env struct {
	o     options
	sz    sizes
	admin *pgxpool.Pool // small pool for set-up, checks and clean-up
	nc    *nats.Conn
	js    jetstream.JetStream
	run   string // unique per run, in schema and stream names
	logw  io.Writer

	buildOnce sync.Once
	bin       string
	binErr    error
	tmp       string
}

func newEnv(ctx context.Context, o options, logw io.Writer) (*env, error) {
	cfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = 4
	admin, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := admin.Ping(ctx); err != nil {
		admin.Close()
		return nil, fmt.Errorf("PostgreSQL at %s: %w", o.databaseURL, err)
	}
	nc, err := nats.Connect(o.natsURL, nats.Name("outbox-bench"))
	if err != nil {
		admin.Close()
		return nil, fmt.Errorf("NATS at %s: %w", o.natsURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		admin.Close()
		nc.Close()
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "outbox-bench-")
	if err != nil {
		return nil, err
	}
	return &env{o: o, sz: o.sz, admin: admin, nc: nc, js: js, logw: logw, tmp: tmp,
		run: strings.ReplaceAll(uuid.NewString()[:6], "-", "")}, nil
}

func (e *env) close() {
	e.admin.Close()
	e.nc.Close()
	_ = os.RemoveAll(e.tmp)
}

func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(e.logw, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// pool opens a pool of at most n connections on the database.
func (e *env) pool(ctx context.Context, n int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.o.databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = n
	return pgxpool.NewWithConfig(ctx, cfg)
}

// relayPool opens a pool for a relay (ours, the naive one, Watermill's
// forwarder) with the session settings "outbox relay" uses
// (outbox.RelaySessionParams: jit off, synchronous_commit off), so that every
// relay in a comparison runs on the same terms.
func (e *env) relayPool(ctx context.Context, n int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.o.databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = n
	for k, v := range outbox.RelaySessionParams(e.o.syncCommit) {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// space is a scenario's own schema and stream.
type space struct {
	schema, stream, prefix string
}

// newSpace creates and migrates a schema and names a stream for scenario
// name; cleanup drops both.
func (e *env) newSpace(ctx context.Context, name string) (space, func(), error) {
	n := strings.ReplaceAll(strings.ToLower(name), "-", "_")
	s := space{
		schema: "bench_" + e.run + "_" + n,
		stream: strings.ToUpper("BENCH_" + e.run + "_" + n),
		prefix: "bench_" + e.run + "_" + n,
	}
	_, _ = e.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+s.schema+" CASCADE")
	if _, err := outboxmigrate.Migrate(ctx, e.admin, s.schema); err != nil {
		return s, nil, fmt.Errorf("migrate %s: %w", s.schema, err)
	}
	cleanup := func() {
		if e.o.keep {
			return
		}
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := e.admin.Exec(c, "DROP SCHEMA IF EXISTS "+s.schema+" CASCADE"); err != nil {
			e.logf("drop schema %s: %v", s.schema, err)
		}
		if err := e.js.DeleteStream(c, s.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			e.logf("delete stream %s: %v", s.stream, err)
		}
	}
	return s, cleanup, nil
}

// publisher returns an outboxnats publisher on the space's stream (creating
// it) over a connection of its own.
func (e *env) publisher(ctx context.Context, s space) (*outboxnats.Publisher, *nats.Conn, error) {
	nc, err := nats.Connect(e.o.natsURL, nats.Name("outbox-bench-relay"))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	p, err := outboxnats.NewPublisher(ctx, js, outboxnats.Config{Stream: s.stream, SubjectPrefix: s.prefix})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return p, nc, nil
}

// streamMsgs is how many messages the stream holds (0 when it is missing).
func (e *env) streamMsgs(ctx context.Context, stream string) uint64 {
	st, err := e.js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// payload is the body of every generated event (an order of ~200 bytes).
const payload = `{"order_id":"00000000-0000-7000-8000-000000000000","customer_id":"customer-42","items":[{"sku":"sku-1","quantity":2},{"sku":"sku-7","quantity":1}],"total_cents":12345,"currency":"EUR"}`

// loadBacklog inserts n pending events over aggs aggregates straight into
// the outbox table, the way the writer would have left them: event i belongs
// to a pseudo-random aggregate, each aggregate's sequences follow the
// events' order, occurred_at increases with i.
//
// Event ids are ordered, like the writer's UUIDv7s, starting at idBase;
// aggregate ids are prefix followed by a number.
func (e *env) loadBacklog(ctx context.Context, schema string, n, aggs int, prefix string, idBase int64, published bool) error {
	pub := "NULL"
	if published {
		pub = "now()"
	}
	_, err := e.admin.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload,
	occurred_at, available_at, published_at)
SELECT lpad(to_hex(%[6]d + i), 32, '0')::uuid, 'order', %[7]s || a, row_number() OVER (PARTITION BY a ORDER BY i), 'OrderUpdated', %[2]s::jsonb,
	t, t, %[3]s
FROM (SELECT i, (hashint4(i) & 2147483647) %% %[4]d AS a,
	now() - interval '1 hour' + i * interval '1 microsecond' AS t
	FROM generate_series(0, %[5]d - 1) AS i) g`, schema, quote(payload), pub, aggs, n, idBase, quote(prefix)))
	if err != nil {
		return fmt.Errorf("load backlog: %w", err)
	}
	_, err = e.admin.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.outbox_aggregates (aggregate_type, aggregate_id, last_sequence)
SELECT aggregate_type, aggregate_id, max(aggregate_sequence) FROM %[1]s.outbox_events GROUP BY 1, 2
ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = EXCLUDED.last_sequence`, schema))
	if err != nil {
		return fmt.Errorf("load counters: %w", err)
	}
	if _, err := e.admin.Exec(ctx, "VACUUM (ANALYZE) "+schema+".outbox_events"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// unpublished counts the schema's unpublished events.
func (e *env) unpublished(ctx context.Context, schema string) (int64, error) {
	var n int64
	err := e.admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_events WHERE published_at IS NULL").Scan(&n)
	return n, err
}

// waitDrained waits until the stream holds want messages and the schema has
// no unpublished event, polling the cheap stream count first.
func (e *env) waitDrained(ctx context.Context, s space, want int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for e.streamMsgs(ctx, s.stream) < uint64(want) {
		if time.Now().After(deadline) {
			return fmt.Errorf("stream %s holds %d of %d messages after %s", s.stream, e.streamMsgs(ctx, s.stream), want, limit)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	for {
		n, err := e.unpublished(ctx, s.schema)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d events still unpublished after %s", n, limit)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// checkOrder reads the whole stream back and checks I5: per aggregate, the
// first appearance of each sequence comes in increasing order, with no gap.
// It returns how many distinct events the stream holds.
func (e *env) checkOrder(ctx context.Context, stream string) (int, error) {
	st, err := e.js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	total := int(info.State.Msgs)
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, err
	}
	next := map[string]int64{}
	seen := map[string]bool{}
	read := 0
	for read < total {
		// No more than the stream has left: a fetch of more waits its whole
		// FetchMaxWait for messages that never come.
		batch, err := cons.Fetch(min(1000, total-read), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return 0, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			read++
			h := m.Headers()
			id := h.Get(outboxnats.HeaderID)
			if seen[id] {
				continue
			}
			seen[id] = true
			agg := h.Get(outboxnats.HeaderAggregateType) + "/" + h.Get(outboxnats.HeaderSubject)
			seq, err := strconv.ParseInt(h.Get(outboxnats.HeaderSequence), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("message %s: sequence: %w", id, err)
			}
			if want := next[agg] + 1; seq != want {
				return 0, fmt.Errorf("I5 violated: aggregate %s: sequence %d reached the stream when %d was expected", agg, seq, want)
			}
			next[agg] = seq
		}
		if batch.Error() != nil {
			return 0, batch.Error()
		}
		if got == 0 {
			return 0, fmt.Errorf("stream %s: read %d of %d messages", stream, read, total)
		}
	}
	return len(seen), nil
}

// percentiles returns the p50, p99 and max of ds in milliseconds.
func percentiles(ds []time.Duration) (p50, p99, max float64) {
	if len(ds) == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		if i < 0 {
			i = 0
		}
		return ms(s[i])
	}
	return at(0.50), at(0.99), ms(s[len(s)-1])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// outboxBinary builds cmd/outbox once into the run's temporary directory.
func (e *env) outboxBinary() (string, error) {
	e.buildOnce.Do(func() {
		root, err := repoRoot()
		if err != nil {
			e.binErr = err
			return
		}
		e.bin = filepath.Join(e.tmp, "outbox")
		cmd := exec.Command("go", "build", "-o", e.bin, "./cmd/outbox")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = e.logw, e.logw
		if err := cmd.Run(); err != nil {
			e.binErr = fmt.Errorf("build cmd/outbox: %w", err)
		}
	})
	return e.bin, e.binErr
}

// repoRoot finds the outbox module's directory (the parent of bench/).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/pgoutbox/outbox\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("cannot find the outbox module above %s: run the bench from the repository", dir)
		}
	}
}

// machineLine describes the machine and the servers' versions.
func machineLine(ctx context.Context, e *env) string {
	var pg string
	_ = e.admin.QueryRow(ctx, "SHOW server_version").Scan(&pg)
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1] + " kB"
	}
	return fmt.Sprintf("%d CPUs, %s memory, PostgreSQL %s, NATS %s, %s", runtime.NumCPU(), mem, pg,
		e.nc.ConnectedServerVersion(), runtime.Version())
}
