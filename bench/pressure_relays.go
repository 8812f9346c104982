package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
)

// relayAppPrefix starts the application_name of every relay connection of
// a pressure run: the kill cells select the relays' backends by it. `outbox
// relay` sets no application_name of its own; the bench passes one in the
// database URL (a libpq parameter every driver honours), which the relay's
// pool keeps.
const relayAppPrefix = "bench-relay-"

// withApp returns the database URL with application_name set.
func withApp(dbURL, app string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// pressureRelay is one relay of a pressure run: an `outbox relay` process,
// or a worker of the naive relay in the bench process.
type pressureRelay struct {
	name string // its id and application_name

	// A process.
	cmd         *exec.Cmd
	bin         string
	args        []string
	logPath     string
	metricsAddr string
	exited      atomic.Bool
	exitErr     atomic.Pointer[error]
	waited      chan struct{}

	// The naive relay's worker.
	naive *naiveWorker
}

// freeAddr returns a free TCP address on 127.0.0.1.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startRelayProcs starts k `outbox relay` processes at their defaults on the
// space (extra flags appended: --mode cdc), each with its metrics and
// readiness endpoints on a free port, and connections named for the kill
// cells.
func startRelayProcs(e *env, bin, kind string, k int, s space, extra ...string) ([]*pressureRelay, error) {
	var rs []*pressureRelay
	for i := 0; i < k; i++ {
		name := fmt.Sprintf("%s%s-%d", relayAppPrefix, kind, i)
		dbURL, err := withApp(e.o.databaseURL, name)
		if err != nil {
			return rs, err
		}
		addr, err := freeAddr()
		if err != nil {
			return rs, err
		}
		logf, err := os.CreateTemp(e.tmp, name+"-*.log")
		if err != nil {
			return rs, err
		}
		_ = logf.Close()
		// --metrics-db-interval: the database gauges (a pending count
		// among them) are sampled once, not at each of the bench's
		// scrapes: the scrapes are for the counters and histograms.
		args := append([]string{"relay", "--database-url", dbURL, "--schema", s.schema,
			"--destination", e.o.natsURL, "--nats-stream", s.stream, "--nats-subject-prefix", s.prefix,
			"--id", name, "--metrics-addr", addr, "--metrics-db-interval", "24h"}, extra...)
		r := &pressureRelay{name: name, bin: bin, args: args, logPath: logf.Name(), metricsAddr: addr}
		if err := r.start(); err != nil {
			return rs, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// start starts the relay's process, its output appended to its log. It is
// not safe for concurrent use with the methods that read the process.
func (r *pressureRelay) start() error {
	logf, err := os.OpenFile(r.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, r.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return err
	}
	waited := make(chan struct{})
	r.cmd, r.waited = cmd, waited
	r.exited.Store(false)
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		r.exitErr.Store(&err)
		r.exited.Store(true)
		close(waited)
	}()
	return nil
}

// kill ends the relay's process with SIGKILL (no graceful shutdown: a
// crash) and waits until it is gone; start runs it again.
func (r *pressureRelay) kill() {
	_ = r.cmd.Process.Kill()
	<-r.waited
}

// stop ends the relay: SIGTERM (its graceful shutdown), SIGKILL after 20 s.
func (r *pressureRelay) stop() {
	if r.naive != nil {
		r.naive.stop()
		return
	}
	if r.exited.Load() {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.waited:
	case <-time.After(20 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.waited
	}
}

// logTail is the last lines of the relay process's log.
func (r *pressureRelay) logTail(n int) string {
	if r.logPath == "" {
		return ""
	}
	b, err := os.ReadFile(r.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

var scrapeClient = &http.Client{Timeout: 2 * time.Second}

// readyz returns the status of the relay's /readyz (0 when it did not
// answer) and its body's first line when not 200.
func (r *pressureRelay) readyz(ctx context.Context) (int, string) {
	if r.metricsAddr == "" {
		return http.StatusOK, ""
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.metricsAddr+"/readyz", nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, ""
	}
	line, _ := bufio.NewReader(io.LimitReader(resp.Body, 512)).ReadString('\n')
	return resp.StatusCode, strings.TrimSpace(line)
}

// relayMetrics are the series the run reads from a relay's /metrics (or the
// naive worker's own counters). Counters and histogram sums are cumulative.
type relayMetrics struct {
	ok                       bool
	claimSum, claimCount     float64 // outbox_db_statement_seconds{statement="claim"}
	markSum, markCount       float64 // statement="mark_published"
	fullSum, fullCount       float64 // statement="full_scan": background full scans, apart from the claims
	expired, conflicts       float64 // outbox_expired_claims_total, outbox_lease_conflicts_total
	published, claimedEvents float64
	cdcLeft                  float64 // outbox_cdc_events_left_total
	cdcPublished             float64 // outbox_cdc_events_published_total: published by the stream
	streaming                float64 // outbox_cdc_streaming: 1, 0, or -1 when absent
}

// metrics scrapes the relay's /metrics.
func (r *pressureRelay) metrics(ctx context.Context) relayMetrics {
	if r.naive != nil {
		return r.naive.metrics()
	}
	m := relayMetrics{streaming: -1}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.metricsAddr+"/metrics", nil)
	if err != nil {
		return m
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return m
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return m
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "outbox_") {
			continue
		}
		name, labels, value, ok := parseSample(line)
		if !ok {
			continue
		}
		switch name {
		case "outbox_db_statement_seconds_sum", "outbox_db_statement_seconds_count":
			sum := strings.HasSuffix(name, "_sum")
			switch {
			case strings.Contains(labels, `statement="claim"`) && sum:
				m.claimSum += value
			case strings.Contains(labels, `statement="claim"`):
				m.claimCount += value
			case strings.Contains(labels, `statement="full_scan"`) && sum:
				m.fullSum += value
			case strings.Contains(labels, `statement="full_scan"`):
				m.fullCount += value
			case strings.Contains(labels, `statement="mark_published"`) && sum:
				m.markSum += value
			case strings.Contains(labels, `statement="mark_published"`):
				m.markCount += value
			}
		case "outbox_expired_claims_total":
			m.expired = value
		case "outbox_lease_conflicts_total":
			m.conflicts = value
		case "outbox_published_total":
			m.published = value
		case "outbox_claimed_events_total":
			m.claimedEvents = value
		case "outbox_cdc_events_left_total":
			m.cdcLeft = value
		case "outbox_cdc_events_published_total":
			m.cdcPublished = value
		case "outbox_cdc_streaming":
			m.streaming = value
		}
	}
	m.ok = sc.Err() == nil
	return m
}

// parseSample splits a Prometheus text sample line: name{labels} value.
func parseSample(line string) (name, labels string, value float64, ok bool) {
	sp := strings.LastIndexByte(line, ' ')
	if sp < 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(line[sp+1:], 64)
	if err != nil {
		return "", "", 0, false
	}
	head := line[:sp]
	if i := strings.IndexByte(head, '{'); i >= 0 {
		return head[:i], head[i:], v, true
	}
	return head, "", v, true
}

// naiveWorker is one worker of the naive relay, run live beside the
// writers: claim up to 1,000 pending rows, oldest first, FOR UPDATE SKIP
// LOCKED with a 30 s lease and no regard for aggregates; one Publish call
// with all of them (the outboxnats publisher, as ours uses); mark the
// acknowledged ones published; repeat, polling every 10 ms when it found
// nothing. A failed statement is retried after 50 ms; rows it had claimed
// wait for their lease. No ordering, no fencing.
type naiveWorker struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	m       relayMetrics
	dbErrs  atomic.Int64
	pubErrs atomic.Int64
	lastErr atomic.Pointer[string]
}

func (w *naiveWorker) metrics() relayMetrics {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.m
	m.ok, m.streaming = true, -1
	m.expired, m.conflicts = math.NaN(), math.NaN() // not counted
	return m
}

func (w *naiveWorker) stop() {
	w.cancel()
	<-w.done
}

// startNaive starts k naive workers on the space, each with a pool of its
// own (the relays' session settings) named for the kill cells.
func startNaive(ctx context.Context, e *env, s space, k int) ([]*pressureRelay, error) {
	var rs []*pressureRelay
	events := s.schema + ".outbox_events"
	claim := `UPDATE ` + events + ` e SET claimed_by = $1, claim_until = now() + interval '30 seconds'
WHERE e.event_id IN (SELECT event_id FROM ` + events + `
	WHERE published_at IS NULL AND (claim_until IS NULL OR claim_until < now())
	ORDER BY available_at, occurred_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type, e.schema_version,
	coalesce(e.content_type, ` + quote(outbox.ContentTypeJSON) + `), e.payload, e.occurred_at`
	mark := `UPDATE ` + events + ` SET published_at = now(), claimed_by = NULL, claim_until = NULL WHERE event_id = ANY($1)`
	for i := 0; i < k; i++ {
		name := fmt.Sprintf("%snaive-%d", relayAppPrefix, i)
		dbURL, err := withApp(e.o.databaseURL, name)
		if err != nil {
			return rs, err
		}
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return rs, err
		}
		cfg.MaxConns = 2
		for k, v := range outbox.RelaySessionParams(false) {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return rs, err
		}
		pub, nc, err := e.publisher(ctx, s)
		if err != nil {
			pool.Close()
			return rs, err
		}
		wctx, cancel := context.WithCancel(ctx)
		w := &naiveWorker{cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(w.done)
			defer pool.Close()
			defer nc.Close()
			for wctx.Err() == nil {
				n, err := w.once(wctx, pool, pub, name, claim, mark)
				switch {
				case wctx.Err() != nil:
				case err != nil:
					w.dbErrs.Add(1)
					msg := err.Error()
					w.lastErr.Store(&msg)
					_ = sleepCtx(wctx, 50*time.Millisecond)
				case n == 0:
					_ = sleepCtx(wctx, 10*time.Millisecond)
				}
			}
		}()
		rs = append(rs, &pressureRelay{name: name, naive: w})
	}
	return rs, nil
}

// once claims, publishes and marks one batch; it returns how many events it
// claimed.
func (w *naiveWorker) once(ctx context.Context, pool *pgxpool.Pool, pub outbox.Publisher, name, claim, mark string) (int, error) {
	t0 := time.Now()
	rows, err := pool.Query(ctx, claim, name)
	if err != nil {
		return 0, err
	}
	var msgs []outbox.Message
	for rows.Next() {
		var m outbox.Message
		if err := rows.Scan(&m.ID, &m.AggregateType, &m.AggregateID, &m.Sequence, &m.Type, &m.SchemaVersion,
			&m.ContentType, &m.Payload, &m.OccurredAt); err != nil {
			rows.Close()
			return 0, err
		}
		m.OccurredAt, m.Attempt = m.OccurredAt.UTC(), 1
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	claimT := time.Since(t0)
	w.mu.Lock()
	w.m.claimSum += claimT.Seconds()
	w.m.claimCount++
	w.m.claimedEvents += float64(len(msgs))
	w.mu.Unlock()
	if len(msgs) == 0 {
		return 0, nil
	}
	var ids [][16]byte
	var firstErr error
	errs := pub.Publish(ctx, msgs) // nil: every message acknowledged
	for i := range msgs {
		if errs != nil && errs[i] != nil {
			w.pubErrs.Add(1)
			if firstErr == nil {
				firstErr = errs[i]
			}
			continue
		}
		ids = append(ids, msgs[i].ID)
	}
	if len(ids) == 0 {
		return len(msgs), fmt.Errorf("naive: every publish failed: %w", firstErr)
	}
	t1 := time.Now()
	if _, err := pool.Exec(ctx, mark, ids); err != nil {
		return len(msgs), err
	}
	w.mu.Lock()
	w.m.markSum += time.Since(t1).Seconds()
	w.m.markCount++
	w.m.published += float64(len(ids))
	w.mu.Unlock()
	return len(msgs), nil
}
