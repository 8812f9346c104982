package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/examples/orders/inventory"
	"github.com/pgoutbox/outbox/examples/orders/orderevents"
	"github.com/pgoutbox/outbox/examples/orders/ordersapi"
	"github.com/pgoutbox/outbox/internal/cli"
	"github.com/pgoutbox/outbox/internal/destination"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/outboxnats"
)

// The demo's catalogue: the SKUs the orders migration seeds.
var demoSKUs = []string{"SKU-1001", "SKU-1002", "SKU-1003", "SKU-1004", "SKU-1005", "SKU-1006", "SKU-1007", "SKU-1008"}

type demoFlags struct {
	databaseURL string
	dest        destination.Options
	orders      int
	concurrency int
	keep        bool
	timeout     time.Duration
	lostAcks    float64
	seed        uint64
	verbose     bool
}

func runDemo(ctx context.Context, args []string) error {
	return demo(ctx, args, os.Stdout, os.Stderr)
}

// demo parses args and runs the demo, writing its progress and report to
// out and the components' logs to logs.
func demo(ctx context.Context, args []string, out, logs io.Writer) error {
	fs := cli.NewFlagSet("outbox", "demo", `demo [flags]

Runs the example order system in this process: the order HTTP API, the relay
and the inventory consumer, on PostgreSQL (DATABASE_URL) and NATS JetStream
(--destination; an embedded server when unset). It drives orders over HTTP
(creates, cancellations, rollbacks, idempotent retries), waits until every
committed event was published and applied, prints a report and checks the
invariants I1-I5. Each run uses a fresh schema, stream and subject prefix of
its own, removed at the end unless --keep. Exits non-zero if a check fails.`)
	var f demoFlags
	fs.StringVar(&f.databaseURL, "database-url", cli.Env("DATABASE_URL", cli.DatabaseURLDefault), "PostgreSQL connection URL (env DATABASE_URL)")
	fs.StringVar(&f.dest.URL, "destination", cli.Env("OUTBOX_DESTINATION", ""), "NATS server: nats://host:port (env OUTBOX_DESTINATION; default: an embedded server)")
	fs.StringVar(&f.dest.Source, "source", cli.Env("OUTBOX_SOURCE", outboxnats.SourceDefault), "CloudEvents source attribute (env OUTBOX_SOURCE)")
	fs.IntVar(&f.orders, "orders", 200, "orders to place")
	fs.IntVar(&f.concurrency, "concurrency", 8, "concurrent HTTP clients")
	fs.BoolVar(&f.keep, "keep", false, "keep the schema and the stream at the end, to inspect them")
	fs.DurationVar(&f.timeout, "timeout", 60*time.Second, "give up when the run has not converged after this long")
	fs.Float64Var(&f.lostAcks, "lost-acks", 0.05, "fraction of consumer acks dropped after the commit (failpoint consumer/after-commit-before-ack), so redeliveries show the inbox deduplicating; ignored when OUTBOX_FAILPOINTS is set")
	fs.Uint64Var(&f.seed, "seed", 0, "seed of the traffic mix (0: random)")
	fs.BoolVar(&f.verbose, "verbose", false, "log the components' info messages too")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	switch {
	case f.orders < 1:
		return fmt.Errorf("--orders %d must be positive", f.orders)
	case f.concurrency < 1:
		return fmt.Errorf("--concurrency %d must be positive", f.concurrency)
	case f.timeout <= 0:
		return fmt.Errorf("--timeout %s must be positive", f.timeout)
	case f.lostAcks < 0 || f.lostAcks >= 1:
		return fmt.Errorf("--lost-acks %g must be in [0,1)", f.lostAcks)
	}
	if f.seed == 0 {
		f.seed = rand.Uint64()%1_000_000 + 1
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	d := &demoRun{flags: f, out: out, log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: level}))}
	return d.run(ctx)
}

// demoRun is one run of the demo.
type demoRun struct {
	flags demoFlags
	out   io.Writer
	outMu sync.Mutex
	log   *slog.Logger
	start time.Time

	schema, stream, prefix string
	pool                   *pgxpool.Pool
	js                     jetstream.JetStream
	api                    *ordersapi.Service
	relay                  *outbox.Relay
	consumer               *inventory.Consumer
	baseURL                string
	client                 *http.Client

	requests atomic.Int64 // plans finished
	mu       sync.Mutex
	book     demoBook
}

// demoBook is what the HTTP client saw: the truth the database is checked
// against.
type demoBook struct {
	committed          map[string][]orderevents.Item // order id -> items
	cancelled          map[string]bool
	rolledBack         []string // customer ids of rolled-back creates
	replays, conflicts int
	doubleCancels      int
	unexpected         []string
}

func (d *demoRun) printf(format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(d.out, format, args...)
}

func (d *demoRun) run(ctx context.Context) (err error) {
	d.start = time.Now()
	suffix := strings.ReplaceAll(uuid.NewString(), "-", "")[:10]
	d.schema, d.stream, d.prefix = "demo_"+suffix, "DEMO_"+strings.ToUpper(suffix), "demo_"+suffix
	d.book = demoBook{committed: map[string][]orderevents.Item{}, cancelled: map[string]bool{}}

	// NATS: the given server, or an embedded one in a temporary directory.
	natsURL, where := d.flags.dest.URL, d.flags.dest.URL
	if natsURL == "" {
		dir, err := os.MkdirTemp("", "outbox-demo-nats-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		emb, err := outboxnats.StartEmbedded(dir, -1)
		if err != nil {
			return fmt.Errorf("start embedded NATS: %w", err)
		}
		defer emb.Shutdown()
		natsURL = emb.ClientURL()
		where = "embedded JetStream at " + natsURL
	}
	d.printf("outbox demo: %d orders, seed %d\n  postgres schema %s, NATS %s\n  stream %s, subjects %s.>\n",
		d.flags.orders, d.flags.seed, d.schema, where, d.stream, d.prefix)

	pcfg, err := pgxpool.ParseConfig(d.flags.databaseURL)
	if err != nil {
		return fmt.Errorf("database url: %w", err)
	}
	pcfg.MaxConns = int32(d.flags.concurrency + inventory.WorkersDefault + 8)
	if d.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer d.pool.Close()
	if err := d.pool.Ping(ctx); err != nil {
		return fmt.Errorf("connect to database %s:%d: %w", pcfg.ConnConfig.Host, pcfg.ConnConfig.Port, err)
	}
	if err := pgident.ValidateSchema(d.schema); err != nil {
		return err
	}
	nc, err := destination.ConnectNATS(natsURL, "outbox-demo")
	if err != nil {
		return err
	}
	defer nc.Close()
	if d.js, err = jetstream.New(nc); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// Registered after the connection, so it runs while NATS and the pool
	// are still open.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if d.flags.keep {
			if d.flags.dest.URL == "" {
				d.printf("kept schema %s (--keep); the embedded NATS server's stream went with it\n", d.schema)
			} else {
				d.printf("kept schema %s and stream %s on %s (--keep)\n", d.schema, d.stream, d.flags.dest.URL)
			}
			return
		}
		if _, derr := d.pool.Exec(cctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{d.schema}.Sanitize()+" CASCADE"); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop schema %s: %w", d.schema, derr))
		}
		if d.js != nil && d.flags.dest.URL != "" {
			if derr := d.js.DeleteStream(cctx, d.stream); derr != nil && !errors.Is(derr, jetstream.ErrStreamNotFound) {
				err = errors.Join(err, fmt.Errorf("delete stream %s: %w", d.stream, derr))
			}
		}
	}()

	if err := d.setUp(ctx); err != nil {
		return err
	}

	// The lost acks: the failpoint between the consumer's commit and its ack.
	if os.Getenv(failpoint.EnvVar) == "" && d.flags.lostAcks > 0 {
		spec := fmt.Sprintf("%s=error%%%g", inventory.FailpointAfterCommitBeforeAck, d.flags.lostAcks)
		if err := failpoint.Enable(spec, d.flags.seed); err != nil {
			return err
		}
		defer func() { _ = failpoint.Enable("", 0) }()
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(runCtx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: d.api.Handler(), ReadHeaderTimeout: 10 * time.Second}
	d.baseURL = "http://" + ln.Addr().String()
	d.client = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: d.flags.concurrency}}
	defer d.client.CloseIdleConnections()
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("order API: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	g.Go(func() error { return componentDone("relay", gctx, d.relay.Run(gctx)) })
	g.Go(func() error { return componentDone("inventory consumer", gctx, d.consumer.Run(gctx)) })
	d.printf("  order API %s, relay %s, inventory consumer (durable %s, %d workers) running\n",
		d.baseURL, d.relay.ID(), inventory.DurableDefault, inventory.WorkersDefault)

	deadline := time.Now().Add(d.flags.timeout)
	waitCtx, cancelWait := context.WithDeadline(gctx, deadline)
	defer cancelWait()
	progressDone := make(chan struct{})
	go d.progress(waitCtx, progressDone)
	d.drive(waitCtx)
	d.printf("  [%5.1fs] %d/%d orders done over HTTP; waiting for the relay and the consumer\n",
		time.Since(d.start).Seconds(), d.requests.Load(), d.flags.orders)
	convErr := d.converge(waitCtx)
	cancelWait()
	<-progressDone

	stop()
	if gerr := g.Wait(); gerr != nil {
		return gerr
	}
	if convErr != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	checkCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	repErr := d.report(checkCtx)
	switch {
	case convErr != nil && repErr != nil:
		return fmt.Errorf("%w; %w", convErr, repErr)
	case convErr != nil:
		return convErr
	}
	return repErr
}

// componentDone turns a component's early exit into an error that stops the
// demo.
func componentDone(name string, ctx context.Context, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if ctx.Err() == nil {
		return fmt.Errorf("%s stopped unexpectedly", name)
	}
	return nil
}

// setUp migrates the schema and builds the components.
func (d *demoRun) setUp(ctx context.Context) error {
	var err error
	d.api, err = ordersapi.New(d.pool, ordersapi.Config{Schema: d.schema, Logger: d.log})
	if err != nil {
		return err
	}
	if err := d.api.Migrate(ctx); err != nil {
		return err
	}
	if err := inventory.Migrate(ctx, d.pool, d.schema, ""); err != nil {
		return err
	}
	pub, err := outboxnats.NewPublisher(ctx, d.js, outboxnats.Config{Stream: d.stream, SubjectPrefix: d.prefix, Source: d.flags.dest.Source})
	if err != nil {
		return err
	}
	d.relay, err = outbox.NewRelay(d.pool, outbox.RelayConfig{
		Publisher: pub, Schema: d.schema, ID: "demo-relay-" + d.schema[len("demo_"):],
		PollInterval: 250 * time.Millisecond, Logger: d.log,
	})
	if err != nil {
		return err
	}
	d.consumer, err = inventory.New(d.pool, d.js, inventory.Config{
		Schema: d.schema, Stream: d.stream, SubjectPrefix: d.prefix,
		AckWait: 5 * time.Second, Logger: d.log,
	})
	return err
}

// demoPlan is what the client does for one order.
type demoPlan struct {
	req         ordersapi.CreateRequest
	rollback    bool // the request names an unknown SKU
	key         string
	retry       bool // send the create again with the same key
	conflict    bool // reuse the key with a different body
	cancel      bool
	cancelTwice bool
}

func (d *demoRun) plans() []demoPlan {
	rng := rand.New(rand.NewPCG(d.flags.seed, 0x6f7264657273))
	out := make([]demoPlan, d.flags.orders)
	for i := range out {
		p := &out[i]
		n := 1 + rng.IntN(3)
		for _, j := range rng.Perm(len(demoSKUs))[:n] {
			p.req.Items = append(p.req.Items, orderevents.Item{SKU: demoSKUs[j], Quantity: 1 + rng.IntN(5)})
		}
		p.req.CustomerID = fmt.Sprintf("customer-%d", rng.IntN(50))
		if rng.Float64() < 0.10 {
			p.rollback = true
			p.req.CustomerID = fmt.Sprintf("rollback-%d", i)
			p.req.Items = append(p.req.Items, orderevents.Item{SKU: fmt.Sprintf("SKU-UNKNOWN-%d", i), Quantity: 1})
			continue
		}
		if rng.Float64() < 0.30 {
			p.key = fmt.Sprintf("demo-%s-%d", d.schema, i)
			p.retry = rng.Float64() < 0.6
			p.conflict = rng.Float64() < 0.1
		}
		if rng.Float64() < 0.20 {
			p.cancel = true
			p.cancelTwice = rng.Float64() < 0.25
		}
	}
	return out
}

// drive runs the plans over HTTP with several clients.
func (d *demoRun) drive(ctx context.Context) {
	work := make(chan demoPlan)
	var wg sync.WaitGroup
	for range d.flags.concurrency {
		wg.Go(func() {
			for p := range work {
				d.execute(ctx, p)
				d.requests.Add(1)
			}
		})
	}
	for _, p := range d.plans() {
		select {
		case work <- p:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
}

type demoResponse struct {
	status int
	header http.Header
	body   []byte
}

func (d *demoRun) call(ctx context.Context, method, path, key string, body any) (demoResponse, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return demoResponse{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.baseURL+path, rd)
	if err != nil {
		return demoResponse{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(ordersapi.HeaderIdempotencyKey, key)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return demoResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return demoResponse{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func (d *demoRun) unexpected(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.book.unexpected = append(d.book.unexpected, fmt.Sprintf(format, args...))
}

// expectProblem checks that r is an RFC 9457 problem of the given status and
// type.
func (d *demoRun) expectProblem(what string, r demoResponse, err error, status int, typ string) bool {
	if err != nil {
		d.unexpected("%s: %v", what, err)
		return false
	}
	var p ordersapi.Problem
	if r.status != status || r.header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal(r.body, &p) != nil || p.Type != ordersapi.ProblemTypeBase+typ || p.Status != status {
		d.unexpected("%s: want a %d %s problem, got %d %s %s", what, status, typ, r.status, r.header.Get("Content-Type"), bytes.TrimSpace(r.body))
		return false
	}
	return true
}

func (d *demoRun) expectOrder(what string, r demoResponse, err error, status int) (ordersapi.Order, bool) {
	var o ordersapi.Order
	if err != nil {
		d.unexpected("%s: %v", what, err)
		return o, false
	}
	if r.status != status || json.Unmarshal(r.body, &o) != nil || o.ID == "" {
		d.unexpected("%s: want %d with an order, got %d %s", what, status, r.status, bytes.TrimSpace(r.body))
		return o, false
	}
	return o, true
}

func (d *demoRun) execute(ctx context.Context, p demoPlan) {
	if ctx.Err() != nil {
		return
	}
	if p.rollback {
		r, err := d.call(ctx, "POST", "/orders", "", p.req)
		if d.expectProblem("create with an unknown SKU", r, err, http.StatusUnprocessableEntity, "unknown-sku") {
			d.mu.Lock()
			d.book.rolledBack = append(d.book.rolledBack, p.req.CustomerID)
			d.mu.Unlock()
		}
		return
	}
	r, err := d.call(ctx, "POST", "/orders", p.key, p.req)
	o, ok := d.expectOrder("create", r, err, http.StatusCreated)
	if !ok {
		return
	}
	d.mu.Lock()
	d.book.committed[o.ID] = p.req.Items
	d.mu.Unlock()
	if p.retry {
		r, err := d.call(ctx, "POST", "/orders", p.key, p.req)
		if again, ok := d.expectOrder("idempotent retry", r, err, http.StatusOK); ok {
			if again.ID != o.ID || r.header.Get(ordersapi.HeaderIdempotentReplayed) != "true" {
				d.unexpected("idempotent retry of %s answered with order %s", o.ID, again.ID)
			} else {
				d.mu.Lock()
				d.book.replays++
				d.mu.Unlock()
			}
		}
	}
	if p.conflict {
		other := p.req
		other.Items = append([]orderevents.Item{}, p.req.Items...)
		other.Items[0].Quantity++
		r, err := d.call(ctx, "POST", "/orders", p.key, other)
		if d.expectProblem("key reused with another body", r, err, http.StatusUnprocessableEntity, "idempotency-key-reused") {
			d.mu.Lock()
			d.book.conflicts++
			d.mu.Unlock()
		}
	}
	if p.cancel {
		r, err := d.call(ctx, "POST", "/orders/"+o.ID+"/cancel", "", nil)
		if c, ok := d.expectOrder("cancel", r, err, http.StatusOK); ok {
			if c.Status != ordersapi.StatusCancelled {
				d.unexpected("cancel of %s left status %q", o.ID, c.Status)
			}
			d.mu.Lock()
			d.book.cancelled[o.ID] = true
			d.mu.Unlock()
		}
		if p.cancelTwice {
			r, err := d.call(ctx, "POST", "/orders/"+o.ID+"/cancel", "", nil)
			if d.expectProblem("second cancel", r, err, http.StatusConflict, "order-not-cancellable") {
				d.mu.Lock()
				d.book.doubleCancels++
				d.mu.Unlock()
			}
		}
	}
	r, err = d.call(ctx, "GET", "/orders/"+o.ID, "", nil)
	if got, ok := d.expectOrder("get", r, err, http.StatusOK); ok {
		want := ordersapi.StatusCreated
		if p.cancel {
			want = ordersapi.StatusCancelled
		}
		if got.Status != want || len(got.Items) != len(p.req.Items) {
			d.unexpected("get %s: status %q with %d items, want %q with %d", o.ID, got.Status, len(got.Items), want, len(p.req.Items))
		}
	}
}

// demoCounts are the database's view of the progress.
type demoCounts struct {
	written, published, applied int64
}

func (d *demoRun) counts(ctx context.Context) (demoCounts, error) {
	var c demoCounts
	err := d.pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+d.table("outbox_events")+`),
	(SELECT count(*) FROM `+d.table("outbox_events")+` WHERE published_at IS NOT NULL),
	(SELECT count(*) FROM `+d.table("processed_events")+` WHERE consumer_name = $1)`,
		inventory.InboxConsumerDefault).Scan(&c.written, &c.published, &c.applied)
	return c, err
}

func (d *demoRun) table(name string) string { return pgx.Identifier{d.schema, name}.Sanitize() }

// expectedEvents is how many events the client's successful commands wrote.
func (d *demoRun) expectedEvents() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return int64(len(d.book.committed) + len(d.book.cancelled))
}

// progress prints a line every second until ctx ends.
func (d *demoRun) progress(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, err := d.counts(ctx)
		if err != nil {
			continue
		}
		s := d.consumer.Stats()
		d.printf("  [%5.1fs] orders %d/%d | events written %d, published %d, applied %d | duplicates %d, early %d\n",
			time.Since(d.start).Seconds(), d.requests.Load(), d.flags.orders, c.written, c.published, c.applied, s.Duplicates, s.Early)
	}
}

// consumerInfo is the state of the inventory's durable consumer.
func (d *demoRun) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	c, err := d.js.Consumer(ctx, d.stream, inventory.DurableDefault)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// converge waits until every event the client's commands committed was
// written, published and applied.
func (d *demoRun) converge(ctx context.Context) error {
	want := d.expectedEvents()
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	var last demoCounts
	for {
		c, err := d.counts(ctx)
		if err == nil {
			last = c
		}
		if err == nil && c.written == want && c.published == want && c.applied == want {
			// Everything is applied; wait for the redeliveries of dropped
			// acks too, so the duplicates show in the report.
			info, ierr := d.consumerInfo(ctx)
			if ierr == nil && info.NumAckPending == 0 && info.NumPending == 0 {
				d.printf("  [%5.1fs] converged: all %d events written, published and applied\n", time.Since(d.start).Seconds(), want)
				return nil
			}
			err = ierr
		}
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if c, err := d.counts(cctx); err == nil {
				last = c
			}
			cancel()
			return fmt.Errorf("not converged within --timeout %s: %d events expected, %d written, %d published, %d applied",
				d.flags.timeout, want, last.written, last.published, last.applied)
		case <-t.C:
		}
	}
}

type demoCheck struct {
	name, what string
	problems   []string
}

func (c *demoCheck) failf(format string, args ...any) {
	if len(c.problems) < 5 {
		c.problems = append(c.problems, fmt.Sprintf(format, args...))
	} else if len(c.problems) == 5 {
		c.problems = append(c.problems, "...")
	}
}

// report prints the figures and the invariant checks.
func (d *demoRun) report(ctx context.Context) error {
	b := &d.book
	api, cons, relay := d.api.Stats(), d.consumer.Stats(), d.relay.Stats()
	c, err := d.counts(ctx)
	if err != nil {
		return err
	}
	var p50, p99, pmax, a50, a99 float64
	if err := d.pool.QueryRow(ctx, `SELECT
	coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.published_at - e.occurred_at)), 0),
	coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM e.published_at - e.occurred_at)), 0),
	coalesce(max(extract(epoch FROM e.published_at - e.occurred_at)), 0),
	coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM p.processed_at - e.occurred_at)), 0),
	coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM p.processed_at - e.occurred_at)), 0)
FROM `+d.table("outbox_events")+` e
LEFT JOIN `+d.table("processed_events")+` p ON p.consumer_name = $1 AND p.event_id = e.event_id
WHERE e.published_at IS NOT NULL`, inventory.InboxConsumerDefault).Scan(&p50, &p99, &pmax, &a50, &a99); err != nil {
		return fmt.Errorf("lag: %w", err)
	}
	stream, err := d.readStream(ctx)
	if err != nil {
		return err
	}
	ms := func(s float64) string { return fmt.Sprintf("%.1fms", s*1000) }

	d.printf("\nCommands (over HTTP, %d orders requested):\n", d.flags.orders)
	d.printf("  orders committed              %6d\n", len(b.committed))
	d.printf("  orders cancelled              %6d\n", len(b.cancelled))
	d.printf("  rolled back (unknown SKU)     %6d   rows and event written, then rolled back (server: %d)\n", len(b.rolledBack), api.RolledBack)
	d.printf("  idempotent retries            %6d   same Idempotency-Key: same order, nothing written\n", b.replays)
	d.printf("  key reuse refused             %6d   same key, different body: 422\n", b.conflicts)
	d.printf("  second cancels refused        %6d   409\n", b.doubleCancels)
	d.printf("Events:\n")
	d.printf("  written                       %6d   OrderCreated + OrderCancelled rows\n", c.written)
	d.printf("  published                     %6d   marked after the broker's ack (relay: %d claimed, %d failed)\n", c.published, relay.Claimed, relay.Failed)
	d.printf("  in the stream                 %6d   on %d subjects\n", stream.total, len(stream.perSubject))
	d.printf("  delivered to inventory        %6d\n", cons.Delivered)
	d.printf("  applied                       %6d\n", cons.Applied)
	d.printf("  duplicates suppressed         %6d   redeliveries after %d dropped acks\n", cons.Duplicates, failpoint.Fired(inventory.FailpointAfterCommitBeforeAck))
	d.printf("  early (out of order), retried %6d\n", cons.Early)
	d.printf("  commit-to-publish lag         p50 %s  p99 %s  max %s (occurred_at -> published_at)\n", ms(p50), ms(p99), ms(pmax))
	d.printf("  commit-to-apply lag           p50 %s  p99 %s\n", ms(a50), ms(a99))

	checks, err := d.checks(ctx, stream, c)
	if err != nil {
		return err
	}
	d.printf("Invariants:\n")
	failed := 0
	for _, ch := range checks {
		status := "OK  "
		if len(ch.problems) > 0 {
			status = "FAIL"
			failed++
		}
		d.printf("  %-3s %s %s\n", ch.name, status, ch.what)
		for _, p := range ch.problems {
			d.printf("           - %s\n", p)
		}
	}
	elapsed := time.Since(d.start).Round(10 * time.Millisecond)
	if failed > 0 {
		d.printf("demo FAILED: %d of %d checks failed (%s)\n", failed, len(checks), elapsed)
		return fmt.Errorf("%d of %d checks failed", failed, len(checks))
	}
	d.printf("demo passed: all invariants hold (%s)\n", elapsed)
	return nil
}

// demoStream is what the stream holds.
type demoStream struct {
	total      int
	perSubject map[string]uint64 // from the stream's subject counts
	ids        map[uuid.UUID]int
	badOrder   []string
}

// readStream reads every message of the run's subjects in stream order.
func (d *demoRun) readStream(ctx context.Context) (demoStream, error) {
	st := demoStream{ids: map[uuid.UUID]int{}}
	s, err := d.js.Stream(ctx, d.stream)
	if err != nil {
		return st, fmt.Errorf("stream %s: %w", d.stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(d.prefix+".>"))
	if err != nil {
		return st, fmt.Errorf("stream %s: %w", d.stream, err)
	}
	st.perSubject = info.State.Subjects
	want := int(info.State.Msgs)
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{d.prefix + ".>"}})
	if err != nil {
		return st, fmt.Errorf("read stream %s: %w", d.stream, err)
	}
	last := map[string]int64{}
	for st.total < want {
		batch, err := oc.Fetch(want-st.total, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return st, fmt.Errorf("read stream %s: %w", d.stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			st.total++
			msg, err := outboxnats.Decode(m.Headers(), m.Data())
			if err != nil {
				st.badOrder = append(st.badOrder, fmt.Sprintf("message on %s does not decode: %v", m.Subject(), err))
				continue
			}
			st.ids[msg.ID]++
			// Per subject the sequence never goes back and never skips: a
			// republished duplicate may repeat k, but k+1 never precedes k.
			prev := last[m.Subject()]
			if msg.Sequence < prev || msg.Sequence > prev+1 {
				st.badOrder = append(st.badOrder, fmt.Sprintf("%s: sequence %d after %d", m.Subject(), msg.Sequence, prev))
			}
			last[m.Subject()] = max(prev, msg.Sequence)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return st, fmt.Errorf("read stream %s: %w", d.stream, err)
		}
		if n == 0 {
			return st, fmt.Errorf("read stream %s: got %d of %d messages", d.stream, st.total, want)
		}
	}
	return st, nil
}

// checks verifies I1-I5 against PostgreSQL, the stream and the client's book.
func (d *demoRun) checks(ctx context.Context, stream demoStream, c demoCounts) ([]*demoCheck, error) {
	b := &d.book
	api := &demoCheck{name: "API", what: "every HTTP response was the expected one"}
	for _, u := range b.unexpected {
		api.failf("%s", u)
	}

	// The orders and their events, per order.
	type orderRow struct {
		status             string
		created, cancelled int
		subject            string
	}
	orders := map[string]*orderRow{}
	rows, err := d.pool.Query(ctx, `SELECT o.order_id, o.status,
	count(e.event_id) FILTER (WHERE e.event_type = $1),
	count(e.event_id) FILTER (WHERE e.event_type = $2)
FROM `+d.table("orders")+` o
LEFT JOIN `+d.table("outbox_events")+` e ON e.aggregate_type = $3 AND e.aggregate_id = o.order_id
GROUP BY o.order_id, o.status`, orderevents.OrderCreated, orderevents.OrderCancelled, orderevents.AggregateType)
	if err != nil {
		return nil, err
	}
	var id string
	var r orderRow
	if _, err := pgx.ForEachRow(rows, []any{&id, &r.status, &r.created, &r.cancelled}, func() error {
		row := r
		row.subject = outboxnats.Subject(d.prefix, orderevents.AggregateType, id)
		orders[id] = &row
		return nil
	}); err != nil {
		return nil, err
	}

	i1 := &demoCheck{name: "I1", what: fmt.Sprintf("each of %d committed orders has exactly one OrderCreated event, each of %d cancellations one OrderCancelled",
		len(b.committed), len(b.cancelled))}
	if len(orders) != len(b.committed) {
		i1.failf("%d orders in the table, the client saw %d committed", len(orders), len(b.committed))
	}
	for id := range b.committed {
		o := orders[id]
		wantCancel := 0
		if b.cancelled[id] {
			wantCancel = 1
		}
		switch {
		case o == nil:
			i1.failf("order %s: committed but not in the table", id)
		case o.created != 1:
			i1.failf("order %s: %d OrderCreated events", id, o.created)
		case o.cancelled != wantCancel:
			i1.failf("order %s: %d OrderCancelled events, want %d", id, o.cancelled, wantCancel)
		case (o.status == ordersapi.StatusCancelled) != b.cancelled[id]:
			i1.failf("order %s: status %s", id, o.status)
		}
	}

	i2 := &demoCheck{name: "I2", what: fmt.Sprintf("no order row and no event for the %d rolled-back commands, no event without its committed command", len(b.rolledBack))}
	var strayEvents, rbOrders, rbEvents int
	if err := d.pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+d.table("outbox_events")+` e WHERE NOT EXISTS (
		SELECT 1 FROM `+d.table("orders")+` o WHERE o.order_id = e.aggregate_id)),
	(SELECT count(*) FROM `+d.table("orders")+` WHERE customer_id = ANY($1)),
	(SELECT count(*) FROM `+d.table("outbox_events")+` WHERE convert_from(payload_bytes, 'UTF8')::jsonb->>'customer_id' = ANY($1))`,
		b.rolledBack).Scan(&strayEvents, &rbOrders, &rbEvents); err != nil {
		return nil, err
	}
	if strayEvents > 0 {
		i2.failf("%d events of orders that do not exist", strayEvents)
	}
	if rbOrders > 0 || rbEvents > 0 {
		i2.failf("rolled-back commands left %d orders and %d events", rbOrders, rbEvents)
	}
	if want := int64(len(b.committed) + len(b.cancelled)); c.written != want {
		i2.failf("%d events written for %d committed commands", c.written, want)
	}
	if api := d.api.Stats(); api.RolledBack != int64(len(b.rolledBack)) {
		i2.failf("the API rolled back %d transactions, the client saw %d rollbacks", api.RolledBack, len(b.rolledBack))
	}

	i3 := &demoCheck{name: "I3", what: fmt.Sprintf("all %d events published and in the stream, per subject as many messages as events", c.written)}
	var unpublished, quarantined int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL), count(*) FILTER (WHERE quarantined_at IS NOT NULL)
FROM `+d.table("outbox_events")).Scan(&unpublished, &quarantined); err != nil {
		return nil, err
	}
	if unpublished > 0 || quarantined > 0 {
		i3.failf("%d events unpublished, %d quarantined", unpublished, quarantined)
	}
	ids, err := d.pool.Query(ctx, `SELECT event_id FROM `+d.table("outbox_events"))
	if err != nil {
		return nil, err
	}
	eventIDs, err := pgx.CollectRows(ids, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	for _, id := range eventIDs {
		if stream.ids[id] == 0 {
			i3.failf("event %s is not in the stream", id)
		}
	}
	for id, o := range orders {
		if got, want := stream.perSubject[o.subject], uint64(o.created+o.cancelled); got < want {
			i3.failf("order %s: %d messages on %s, %d events", id, got, o.subject, want)
		}
	}

	i4 := &demoCheck{name: "I4", what: "reserved stock equals the quantities of the non-cancelled orders; every event applied exactly once"}
	want := map[string]int64{}
	for id, items := range b.committed {
		if !b.cancelled[id] {
			for _, it := range items {
				want[it.SKU] += int64(it.Quantity)
			}
		}
	}
	srows, err := d.pool.Query(ctx, `SELECT sku, reserved FROM `+d.table("inventory_stock"))
	if err != nil {
		return nil, err
	}
	got := map[string]int64{}
	var sku string
	var reserved int64
	if _, err := pgx.ForEachRow(srows, []any{&sku, &reserved}, func() error { got[sku] = reserved; return nil }); err != nil {
		return nil, err
	}
	skus := make([]string, 0, len(want)+len(got))
	for s := range want {
		skus = append(skus, s)
	}
	for s := range got {
		if _, ok := want[s]; !ok {
			skus = append(skus, s)
		}
	}
	sort.Strings(skus)
	for _, s := range skus {
		if got[s] != want[s] {
			i4.failf("%s: %d reserved, orders want %d", s, got[s], want[s])
		}
	}
	var processed, missing int64
	if err := d.pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+d.table("processed_events")+` WHERE consumer_name = $1),
	(SELECT count(*) FROM `+d.table("outbox_events")+` e WHERE NOT EXISTS (
		SELECT 1 FROM `+d.table("processed_events")+` p WHERE p.consumer_name = $1 AND p.event_id = e.event_id))`,
		inventory.InboxConsumerDefault).Scan(&processed, &missing); err != nil {
		return nil, err
	}
	cons := d.consumer.Stats()
	if processed != c.written || missing > 0 {
		i4.failf("%d inbox rows for %d events (%d events not applied)", processed, c.written, missing)
	}
	if cons.Applied != c.written {
		i4.failf("the consumer applied %d events, %d were written", cons.Applied, c.written)
	}

	i5 := &demoCheck{name: "I5", what: "per order, the stream holds the events in sequence order and the inbox high-water mark is the last sequence"}
	for _, p := range stream.badOrder {
		i5.failf("%s", p)
	}
	var behind int
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM `+d.table("outbox_aggregates")+` a
LEFT JOIN `+d.table("inbox_aggregates")+` m
	ON m.consumer_name = $1 AND m.aggregate_type = a.aggregate_type AND m.aggregate_id = a.aggregate_id
WHERE coalesce(m.last_sequence, 0) <> a.last_sequence`, inventory.InboxConsumerDefault).Scan(&behind); err != nil {
		return nil, err
	}
	if behind > 0 {
		i5.failf("%d orders whose inbox high-water mark is not their last sequence", behind)
	}
	if cons.Anomalies > 0 {
		i5.failf("%d cancellations were applied before their order's creation", cons.Anomalies)
	}
	return []*demoCheck{api, i1, i2, i3, i4, i5}, nil
}
