package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgcluster"
)

// pressurePhase is a cell or the recovery after it.
type pressurePhase struct {
	name, cell string
	recovery   bool
	dur        time.Duration
	rate       int // events/s offered
	start, end time.Time
	logFrom    int // offsets in the server's log
	logTo      int
	load       string // the machine's 1-minute load average at the end

	mu          sync.Mutex
	kills       int
	killed      map[string]int // what the killed backends were running (or last ran), by statement shape
	held        int            // pool: connections held
	readerLoops int64          // readers: snapshots read
	takeover    *takeover      // takeover: what the kill of the streaming relay cost
	notes       []string
	writerErrs  atomic.Int64
	firstErr    atomic.Pointer[string]
}

func (p *pressurePhase) note(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notes = append(p.notes, fmt.Sprintf(format, args...))
}

// pressureTick is one second of a run.
type pressureTick struct {
	at      time.Time
	phase   int // -1: warm-up or drain
	backlog int64
	dead    int64
	live    int64
	autovac int64
	pending int64           // -1 when not counted
	srv     claimStatements // the incremental claim in pg_stat_statements
	ready   []int           // per relay: /readyz status (0: no answer)
	m       []relayMetrics
}

// pressureOutcome is one relay kind's run.
type pressureOutcome struct {
	kind      string
	relays    []string
	phases    []*pressurePhase
	ticks     []pressureTick
	l         *ledger
	notReady  map[string]int // /readyz answers other than 200, by reason
	exits     []string
	tapDrops  int
	badMsgs   int64
	drainedIn time.Duration // after the last phase, until the backlog was 0 (-1: not within the limit)
	leftOver  int64
	skipped   int64 // transactions the pacer could not offer (writers stalled more than a second)
	serverLog string
	stats     []phaseStats
}

var errRollback = errors.New("bench: roll back on purpose")

// runPressure runs one relay kind through the selected cells.
func runPressure(ctx context.Context, e *env, cluster *pgcluster.Cluster, bin, kind string, sz pressureSizes) (*pressureOutcome, error) {
	e.logf("pressure/%s: start", kind)
	s, cleanup, err := e.newSpace(ctx, "pressure-"+kind)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// The stream exists before the relays and the consumer start.
	if _, nc, err := e.publisher(ctx, s); err != nil {
		return nil, err
	} else {
		nc.Close()
	}
	out := &pressureOutcome{kind: kind, l: newLedger(sz.aggregates), notReady: map[string]int{}}
	for _, c := range sz.cells {
		if c == "takeover" && kind != "cdc" {
			continue // a takeover is of a CDC stream
		}
		out.phases = append(out.phases,
			&pressurePhase{name: c, cell: c, dur: sz.cellDur[c], rate: cellRate(c, sz.rate)},
			&pressurePhase{name: c + "/recovery", cell: c, recovery: true, dur: sz.recovery, rate: sz.rate})
	}
	dest, err := openDestination(ctx, e, s, out.l)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	defer dest.close()

	var relays []*pressureRelay
	switch kind {
	case "polling":
		relays, err = startRelayProcs(e, bin, kind, 2, s)
	case "cdc":
		relays, err = startRelayProcs(e, bin, kind, 2, s, "--mode", "cdc")
	case "naive":
		relays, err = startNaive(ctx, e, s, 2)
	}
	stopped := false
	stopAll := func() {
		if stopped {
			return
		}
		stopped = true
		var wg sync.WaitGroup
		for _, r := range relays {
			wg.Add(1)
			go func() { defer wg.Done(); r.stop() }()
		}
		wg.Wait()
	}
	defer stopAll()
	if kind == "cdc" {
		defer func() {
			stopAll()
			_, _ = e.admin.Exec(context.WithoutCancel(ctx), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
WHERE NOT active AND strpos(slot_name, $1) > 0`, s.schema)
		}()
	}
	if err != nil {
		return nil, fmt.Errorf("start relays: %w", err)
	}
	for _, r := range relays {
		out.relays = append(out.relays, r.name)
	}
	if err := waitRelaysReady(ctx, kind, relays, time.Minute); err != nil {
		for _, r := range relays {
			if t := r.logTail(10); t != "" {
				e.logf("pressure/%s: %s log:\n%s", kind, r.name, t)
			}
		}
		return nil, err
	}
	e.logf("pressure/%s: %d relays ready", kind, len(relays))

	// Writers, on a pool of their own.
	wcfg, err := pgxpool.ParseConfig(mustApp(e.o.databaseURL, "bench-writer"))
	if err != nil {
		return nil, err
	}
	wcfg.MaxConns = int32(sz.writers)
	wpool, err := pgxpool.NewWithConfig(ctx, wcfg)
	if err != nil {
		return nil, err
	}
	defer wpool.Close()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: s.schema})
	if err != nil {
		return nil, err
	}
	notifier, err := outbox.NewNotifier(wpool, outbox.NotifierConfig{Schema: s.schema, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	defer notifier.Close()
	var cur atomic.Int32
	cur.Store(-1)
	phaseAt := func(i int) *pressurePhase {
		if i < 0 {
			return nil
		}
		return out.phases[i]
	}
	// Each transaction writes one event to a random aggregate and calls the
	// Notifier after its commit. After every 50th, the worker also writes one
	// that it rolls back: its event must never arrive.
	var nth atomic.Int64
	body := []byte(payload)
	txn := func(rollback bool) {
		agg := rand.IntN(sz.aggregates)
		ph := int(cur.Load())
		ix := int32(-1)
		err := pgx.BeginFunc(ctx, wpool, func(tx pgx.Tx) error {
			recs, err := w.InsertTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: aggPrefix + strconv.Itoa(agg),
				Type: "OrderUpdated", Payload: body})
			if err != nil {
				return err
			}
			ix = out.l.register(recs[0].ID, agg, recs[0].Sequence, ph)
			if rollback {
				return errRollback
			}
			return nil
		})
		now := time.Now()
		switch {
		case ix >= 0 && errors.Is(err, errRollback):
			out.l.settle(ix, evRolledBack, now)
			return
		case ix >= 0 && err != nil:
			out.l.settle(ix, evUncertain, now)
		case err == nil:
			out.l.settle(ix, evCommitted, now)
			notifier.Notify()
			return
		}
		if p := phaseAt(ph); p != nil {
			p.writerErrs.Add(1)
			msg := err.Error()
			p.firstErr.CompareAndSwap(nil, &msg)
		}
	}
	write := func() {
		txn(false)
		if nth.Add(1)%50 == 0 {
			txn(true)
		}
	}
	var rate atomic.Int64
	rate.Store(int64(sz.rate))
	stopWriters := make(chan struct{})
	writersDone := make(chan struct{})
	go func() {
		defer close(writersDone)
		_, out.skipped = pace(stopWriters, &rate, sz.writers, write)
	}()
	writersStopped := false
	defer func() {
		if !writersStopped {
			close(stopWriters)
			<-writersDone
		}
	}()

	// One sample a second: the backlog (committed, not yet at the
	// consumer: the bench's own count, no query), outbox_events' row
	// statistics, each relay's /readyz and /metrics.
	sctx, stopSampler := context.WithCancel(ctx)
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		out.sample(sctx, e, s, relays, &cur, sz)
	}()
	samplerStopped := false
	defer func() {
		if !samplerStopped {
			stopSampler()
			<-samplerDone
		}
	}()

	if err := sleepCtx(ctx, sz.warmup); err != nil {
		return out, err
	}
	for i, ph := range out.phases {
		// The fault is in place before the cell's clock starts (opening the
		// pool cell's connections takes a moment).
		var stopFault func()
		if !ph.recovery {
			stopFault, err = startFault(ctx, e, s, ph, &rate, sz, relays)
			if err != nil {
				return out, fmt.Errorf("%s: %w", ph.name, err)
			}
		}
		ph.logFrom = len(cluster.Log())
		ph.start = time.Now()
		cur.Store(int32(i))
		e.logf("pressure/%s: %s for %s (backlog %d)", kind, ph.name, ph.dur, out.l.backlog())
		err := sleepCtx(ctx, ph.dur)
		if stopFault != nil {
			stopFault()
		}
		ph.end = time.Now()
		ph.logTo = len(cluster.Log())
		ph.load = loadAvg()
		if err != nil {
			return out, err
		}
		for _, r := range relays {
			if r.exited.Load() {
				msg := fmt.Sprintf("%s exited during %s: %v", r.name, ph.name, *r.exitErr.Load())
				if !containsStr(out.exits, msg) {
					out.exits = append(out.exits, msg)
					e.logf("pressure/%s: %s\n%s", kind, msg, r.logTail(20))
				}
			}
		}
	}
	cur.Store(-1)
	close(stopWriters)
	<-writersDone
	writersStopped = true
	// The last events: wait for the backlog to drain (a lease expiry
	// included), then stop.
	drainStart := time.Now()
	for out.l.backlog() > 0 && time.Since(drainStart) < sz.drain {
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return out, err
		}
	}
	out.leftOver = out.l.backlog()
	out.drainedIn = time.Since(drainStart)
	if out.leftOver > 0 {
		out.drainedIn = -1
	}
	// A moment for late duplicates on the wire, then stop.
	_ = sleepCtx(ctx, 500*time.Millisecond)
	stopSampler()
	<-samplerDone
	samplerStopped = true
	stopAll()
	for _, r := range relays {
		if r.naive == nil && r.exited.Load() {
			if err := *r.exitErr.Load(); err != nil && !containsStr(out.exits, r.name) {
				out.exits = append(out.exits, fmt.Sprintf("%s ended with %v on SIGTERM", r.name, err))
			}
		}
		if r.naive != nil {
			if n := r.naive.dbErrs.Load(); n > 0 {
				out.exits = append(out.exits, fmt.Sprintf("%s: %d failed rounds (retried), the last: %s", r.name, n, shorten(*r.naive.lastErr.Load(), 200)))
			}
		}
	}
	out.tapDrops = dest.tapDrops()
	out.badMsgs = dest.badMsgs.Load()
	out.serverLog = cluster.Log()
	for _, ph := range out.phases {
		if tk := ph.takeover; tk != nil {
			if at := out.l.firstArrivalAfter(tk.at.UnixNano()); at != 0 {
				tk.firstEvent = time.Duration(at - tk.at.UnixNano())
			}
			ph.note("%s", tk.line())
		}
	}
	out.compute(sz)
	for _, st := range out.stats {
		e.logf("pressure/%s: %s", kind, st.line())
	}
	if out.leftOver > 0 {
		e.logf("pressure/%s: %d events still not at the destination %s after the writers stopped", kind, out.leftOver, sz.drain)
	}
	return out, nil
}

func mustApp(dbURL, app string) string {
	u, err := withApp(dbURL, app)
	if err != nil {
		return dbURL
	}
	return u
}

func containsStr(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func cellRate(cell string, base int) int {
	if cell == "load" {
		return base * 3 / 2
	}
	return base
}

// waitRelaysReady waits until every relay answers /readyz with 200 and, in
// CDC mode, one of them streams.
func waitRelaysReady(ctx context.Context, kind string, relays []*pressureRelay, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ready, streaming := 0, false
		var why string
		for _, r := range relays {
			if r.exited.Load() {
				return fmt.Errorf("%s exited at start: %v\n%s", r.name, *r.exitErr.Load(), r.logTail(20))
			}
			code, reason := r.readyz(ctx)
			if code == 200 {
				ready++
			} else {
				why = r.name + ": " + reason
			}
			if kind == "cdc" && r.metrics(ctx).streaming == 1 {
				streaming = true
			}
		}
		if ready == len(relays) && (kind != "cdc" || streaming) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("relays not ready after %s (%d of %d ready, streaming %v): %s", limit, ready, len(relays), streaming, why)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// pace calls do rate times a second (rate read as it goes) from workers
// goroutines, as an open loop, until stop is closed. When the workers are
// so far behind that a second's worth of calls waits for them, the excess is
// dropped (skipped) rather than offered later in a burst.
func pace(stop <-chan struct{}, rate *atomic.Int64, workers int, do func()) (sent, skipped int64) {
	ticks := make(chan struct{}, 8192)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ticks {
				do()
			}
		}()
	}
	last := time.Now()
	due := 0.0
loop:
	for {
		select {
		case <-stop:
			break loop
		default:
		}
		now := time.Now()
		r := float64(rate.Load())
		due += r * now.Sub(last).Seconds()
		last = now
	send:
		for due >= 1 && len(ticks) < int(r) {
			select {
			case ticks <- struct{}{}:
				due--
				sent++
			default:
				break send
			}
		}
		if due > r {
			skipped += int64(due - r)
			due = r
		}
		time.Sleep(500 * time.Microsecond)
	}
	close(ticks)
	wg.Wait()
	return sent, skipped
}

// sample records one tick a second until ctx ends.
func (o *pressureOutcome) sample(ctx context.Context, e *env, s space, relays []*pressureRelay, cur *atomic.Int32, sz pressureSizes) {
	var countConn *pgx.Conn
	if sz.countPending {
		c, err := pgx.Connect(ctx, mustApp(e.o.databaseURL, "bench-count"))
		if err == nil {
			countConn = c
			defer c.Close(context.WithoutCancel(ctx))
		}
	}
	last := make([]relayMetrics, len(relays))
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tk := pressureTick{at: time.Now(), phase: int(cur.Load()), backlog: o.l.backlog(), pending: -1,
			ready: make([]int, len(relays)), m: make([]relayMetrics, len(relays))}
		var wg sync.WaitGroup
		reasons := make([]string, len(relays))
		for i, r := range relays {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk.ready[i], reasons[i] = r.readyz(ctx)
				if m := r.metrics(ctx); m.ok {
					last[i] = m
				}
				tk.m[i] = last[i]
			}()
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = e.admin.QueryRow(qctx, `SELECT n_dead_tup, n_live_tup, autovacuum_count FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = 'outbox_events'`, s.schema).Scan(&tk.dead, &tk.live, &tk.autovac)
		cancel()
		tk.srv = readClaimStatements(ctx, e)
		if countConn != nil {
			qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := countConn.QueryRow(qctx, "SELECT count(*) FROM "+s.schema+".outbox_events WHERE published_at IS NULL").Scan(&tk.pending); err != nil {
				tk.pending = -1
			}
			cancel()
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		for i, code := range tk.ready {
			if code != 200 {
				o.notReady[fmt.Sprintf("%d %s", code, shorten(reasons[i], 100))]++
			}
		}
		o.ticks = append(o.ticks, tk)
	}
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// startFault starts the cell's fault and returns the function that ends it.
func startFault(ctx context.Context, e *env, s space, ph *pressurePhase, rate *atomic.Int64, sz pressureSizes, relays []*pressureRelay) (func(), error) {
	switch ph.cell {
	case "clean":
		return func() {}, nil
	case "load":
		rate.Store(int64(ph.rate))
		return func() { rate.Store(int64(sz.rate)) }, nil
	case "xmin":
		return holdXmin(ctx, e, ph, false)
	case "readers":
		return startReaders(ctx, e, s, ph, sz.readers)
	case "kill-busy", "kill-idle":
		return startKiller(ctx, e, s, ph, sz.killEvery)
	case "pool":
		return holdPool(ctx, e, ph, sz.poolFree)
	case "takeover":
		return startTakeover(ctx, e, s, ph, relays)
	}
	return nil, fmt.Errorf("unknown cell %q", ph.cell)
}

// holdXmin opens a transaction that holds an xid (BEGIN; SELECT
// txid_current()), which pins the xmin, and returns the function that ends
// it. With wal, it also writes WAL in the transaction (a transactional
// logical message, which pgoutput does not send: the relays ask for no
// messages), which pins a logical slot's restart_lsn too.
func holdXmin(ctx context.Context, e *env, ph *pressurePhase, wal bool) (func(), error) {
	conn, err := pgx.Connect(ctx, mustApp(e.o.databaseURL, "bench-xmin"))
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	q, held := "SELECT txid_current(), true", "txid %d held"
	if wal {
		q, held = "SELECT txid_current(), pg_logical_emit_message(true, 'outbox-bench', 'pin') IS NOT NULL", "txid %d held, with WAL written"
	}
	var xid int64
	if err := tx.QueryRow(ctx, q).Scan(&xid, new(bool)); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	ph.note(held, xid)
	return func() {
		c := context.WithoutCancel(ctx)
		_ = tx.Rollback(c)
		_ = conn.Close(c)
	}, nil
}

// startReaders starts n readers, each on a connection of its own, looping
// over REPEATABLE READ transactions that scan outbox_events.
func startReaders(ctx context.Context, e *env, s space, ph *pressurePhase, n int) (func(), error) {
	// Stopping lets each reader finish its snapshot: a cancelled statement
	// would be an ERROR of the bench's own in the server's log.
	var stop atomic.Bool
	cancel := func() { stop.Store(true) }
	var wg sync.WaitGroup
	var loops atomic.Int64
	events := s.schema + ".outbox_events"
	stmts := []string{
		"SELECT count(*) FROM " + events,
		"SELECT count(*) FROM " + events + " WHERE published_at IS NULL",
		"SELECT event_id, aggregate_id, aggregate_sequence FROM " + events + " ORDER BY occurred_at DESC LIMIT 100",
	}
	for i := 0; i < n; i++ {
		conn, err := pgx.Connect(ctx, mustApp(e.o.databaseURL, fmt.Sprintf("bench-reader-%d", i)))
		if err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close(context.WithoutCancel(ctx))
			for !stop.Load() && ctx.Err() == nil {
				err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
					for _, q := range stmts {
						rows, err := tx.Query(ctx, q)
						if err != nil {
							return err
						}
						for rows.Next() {
						}
						rows.Close()
						if err := rows.Err(); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					if ctx.Err() == nil {
						ph.note("reader: %v", err)
						_ = sleepCtx(ctx, 100*time.Millisecond)
					}
					continue
				}
				loops.Add(1)
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
		ph.mu.Lock()
		ph.readerLoops = loops.Load()
		ph.mu.Unlock()
	}, nil
}

var spaces = regexp.MustCompile(`\s+`)

// startKiller terminates, every interval, the relays' backends in the
// cell's states: busy (active, idle in transaction) or idle. It selects them
// by application_name (relayAppPrefix) and leaves replication connections
// (walsenders) alone. It notes what each killed backend was running.
func startKiller(ctx context.Context, e *env, s space, ph *pressurePhase, every time.Duration) (func(), error) {
	states := []string{"active", "idle in transaction"}
	if ph.cell == "kill-idle" {
		states = []string{"idle"}
	}
	conn, err := pgx.Connect(ctx, mustApp(e.o.databaseURL, "bench-killer"))
	if err != nil {
		return nil, err
	}
	var seen string
	if err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(format('%s %s', n, application_name), ', ' ORDER BY application_name), 'none')
FROM (SELECT application_name, count(*) AS n FROM pg_stat_activity
	WHERE backend_type = 'client backend' AND application_name LIKE $1 GROUP BY 1) a`, relayAppPrefix+"%").Scan(&seen); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	ph.note("relay connections at the start: %s", seen)
	stop := make(chan struct{})
	done := make(chan struct{})
	ph.killed = map[string]int{}
	go func() {
		defer close(done)
		defer conn.Close(context.WithoutCancel(ctx))
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rows, err := conn.Query(ctx, `SELECT left(query, 200), pg_terminate_backend(pid) FROM pg_stat_activity
WHERE backend_type = 'client backend' AND application_name LIKE $1 AND state = ANY($2) AND pid <> pg_backend_pid()`,
				relayAppPrefix+"%", states)
			if err != nil {
				if ctx.Err() == nil {
					ph.note("killer: %v", err)
				}
				continue
			}
			for rows.Next() {
				var q string
				var ok bool
				if rows.Scan(&q, &ok) == nil && ok {
					q = strings.NewReplacer(`"`+s.schema+`".`, "", s.schema+".", "", `"`, "").Replace(q)
					q = strings.TrimSpace(spaces.ReplaceAllString(q, " "))
					ph.mu.Lock()
					ph.kills++
					ph.killed[shorten(q, 48)]++
					ph.mu.Unlock()
				}
			}
			rows.Close()
		}
	}()
	return func() { close(stop); <-done }, nil
}

// holdRole is the role of the pool cell's idle connections: another
// application's, not a superuser (superusers may use the reserved slots).
const holdRole = "bench_pool_holder"

// holdPool opens idle connections as holdRole until the server has only
// free connection slots left, and holds them for the cell.
func holdPool(ctx context.Context, e *env, ph *pressurePhase, free int) (func(), error) {
	if _, err := e.admin.Exec(ctx, `DO $$ BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '`+holdRole+`') THEN CREATE ROLE `+holdRole+` LOGIN; END IF;
END $$`); err != nil {
		return nil, err
	}
	var maxConns, used int
	if err := e.admin.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
	(SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('client backend', 'walsender'))::int`).Scan(&maxConns, &used); err != nil {
		return nil, err
	}
	u, err := url.Parse(mustApp(e.o.databaseURL, "bench-pool-holder"))
	if err != nil {
		return nil, err
	}
	u.User = url.User(holdRole)
	want := maxConns - free - used
	var conns []*pgx.Conn
	for len(conns) < want {
		c, err := pgx.Connect(ctx, u.String())
		if err != nil {
			ph.note("pool: connection %d of %d refused: %v", len(conns)+1, want, err)
			break
		}
		conns = append(conns, c)
	}
	ph.held = len(conns)
	ph.note("pool: %d idle connections of %s held beside %d in use, max_connections %d", len(conns), holdRole, used, maxConns)
	return func() {
		for _, c := range conns {
			_ = c.Close(context.WithoutCancel(ctx))
		}
	}, nil
}

// claimStatements are the cumulative figures of the relays' incremental
// claims (the statements that start "WITH fresh AS (": fastClaimSQL) in
// pg_stat_statements: how many, the buffers they touched (hit or read) and
// the server's execution time. Unlike the relays' own round-trip times,
// the buffers do not grow with the machine's load: per claimed event, they
// say whether a claim reads more as the phase goes on (per claim, they
// follow the batch's size, which follows the backlog).
type claimStatements struct {
	calls, rows, blocks, execMs float64 // rows: returned, the claimed events and one row of the cursor's per call
}

// readClaimStatements reads them (zero when the extension is missing).
func readClaimStatements(ctx context.Context, e *env) claimStatements {
	var cs claimStatements
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = e.admin.QueryRow(qctx, `SELECT coalesce(sum(calls), 0)::float8, coalesce(sum(rows), 0)::float8,
	coalesce(sum(shared_blks_hit + shared_blks_read), 0)::float8, coalesce(sum(total_exec_time), 0)::float8
FROM pg_stat_statements WHERE query LIKE 'WITH fresh AS (%'`).Scan(&cs.calls, &cs.rows, &cs.blocks, &cs.execMs)
	return cs
}
