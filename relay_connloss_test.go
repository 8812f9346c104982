package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/cutproxy"
	"github.com/pgoutbox/outbox/internal/outboxtest"
)

// relayPoolThrough is a pool to the test database through proxy p (nil:
// direct), its sessions named app, so that a test can find and end them.
func relayPoolThrough(t *testing.T, p *cutproxy.Proxy, app string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(outboxtest.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	if p != nil {
		u.Host = p.Addr()
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// endSessions terminates every session named app and waits until they are
// gone, as an operator's pg_terminate_backend, a pooler restart or
// idle_session_timeout would.
func endSessions(t *testing.T, admin *pgxpool.Pool, app string) {
	t.Helper()
	// Called from the relay's goroutine (a Publisher's hook): it must not
	// call t.Fatal, which would end that goroutine and leave Run unfinished.
	// It waits for the sessions it ended to be gone, not for every session
	// of app: the relay opens new ones at once (its LISTEN connection is
	// back within milliseconds).
	ctx := context.Background()
	var pids []int32
	if err := admin.QueryRow(ctx, `WITH s AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE application_name = $1)
		SELECT coalesce(array_agg(pid), '{}') FROM s WHERE pg_terminate_backend(pid)`, app).Scan(&pids); err != nil {
		t.Error(err)
		return
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n); err != nil {
			t.Error(err)
			return
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of the %d sessions of %s ended are still there after 10s", n, len(pids), app)
			return
		}
	}
}

// afterAck runs hook once, after the destination acknowledged the first
// call whose messages satisfy match: between the ack and the mark.
type afterAck struct {
	next  outbox.Publisher
	match func([]outbox.Message) bool
	hook  func()
	fired atomic.Bool
}

func (p *afterAck) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := p.next.Publish(ctx, msgs)
	if errs == nil && p.match(msgs) && p.fired.CompareAndSwap(false, true) {
		p.hook()
	}
	return errs
}

// TestLostConnectionDoesNotLoseTheMark loses the relay's connection between
// the destination's ack and the mark, in the three ways production does:
// the session ended before the mark (pg_terminate_backend, a pooler
// restart), the answer to a mark that committed lost on its way back (a
// failover, a network cut), and the session ended before a settle that also
// records a failure (the transactional settle). The relay must write the
// settle again on another connection: the events are marked long before
// their lease (a minute here) could expire, none is published twice, and no
// lease conflict is counted. Before, the mark failed with the connection,
// the events stayed leased for the whole lease and were then published a
// second time (issue 24: 892 events on 84 aggregates waited 30 s).
func TestLostConnectionDoesNotLoseTheMark(t *testing.T) {
	t.Parallel()
	for _, tc := range []string{"session ended", "answer lost", "session ended in a settle with a failure"} {
		t.Run(tc, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			admin, schema := outboxtest.Schema(t)
			w := newWriter(t, schema)
			b := newNATS(t, outboxtest.NATSURL(), 0)
			proxy := cutproxy.New(t, hostPortOf(t, outboxtest.DatabaseURL()))
			app := outboxtest.UniqueName(t, "relay")
			pool := relayPoolThrough(t, proxy, app)
			writeEventsFor(t, admin, w, "a", "b", "c")
			pub := &afterAck{next: b.pub, match: func(msgs []outbox.Message) bool { return len(msgs) == 3 }, hook: func() {
				if tc == "answer lost" {
					proxy.CutReplyContaining([]byte("UPDATE 3\x00"))
					return
				}
				endSessions(t, admin, app)
			}}
			var next outbox.Publisher = pub
			if tc == "session ended in a settle with a failure" {
				writeEventsFor(t, admin, w, "refused")
				next = failingPublisher{next: pub, fail: func(m outbox.Message) error {
					if m.AggregateID == "refused" {
						return errors.New("try later")
					}
					return nil
				}}
			}
			cfg := quietConfig(schema, next)
			cfg.LeaseDuration = time.Minute
			cfg.HeartbeatInterval = outbox.RelayHeartbeatLifetimeMax / 3 // no other UPDATE on the relay's connections
			cfg.VacuumInterval = -1
			cfg.RetryBackoffMin, cfg.RetryBackoffMax = time.Hour, time.Hour
			r, stop := startRelay(t, pool, cfg)
			defer stop()
			outboxtest.Eventually(t, 10*time.Second, "a, b, c marked published, well within their one-minute lease", func() bool {
				var n int
				_ = admin.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_events WHERE published_at IS NOT NULL`).Scan(&n)
				return n == 3 && r.Stats().Published == 3
			})
			if !pub.fired.Load() {
				t.Fatal("the connection was never cut")
			}
			if tc == "answer lost" && proxy.Cuts() != 1 {
				t.Fatalf("%d answers cut, want 1", proxy.Cuts())
			}
			if st := r.Stats(); st.LeaseConflicts != 0 || st.Published != 3 {
				t.Fatalf("stats %+v: want 3 published, no lease conflict", st)
			}
			if tc == "session ended in a settle with a failure" {
				var attempts int
				if err := admin.QueryRow(ctx, `SELECT attempt_count FROM `+schema+`.outbox_events WHERE aggregate_id = 'refused'`).Scan(&attempts); err != nil {
					t.Fatal(err)
				}
				if attempts != 1 {
					t.Fatalf("the failure was recorded %d times, want once", attempts)
				}
			}
			stop()
			seen := checkBrokerOrder(t, b.streamEvents(t))
			for id, n := range seen {
				if n != 1 {
					t.Fatalf("event %s published %d times", id, n)
				}
			}
		})
	}
}

// TestLostIdleConnectionsRetriedAtOnce ends every session of the relay's
// pool while it is idle (a pooler's restart, idle_session_timeout): its
// next rounds meet the dead connections one by one, and each is tried
// again after lostConnRetry, not after the 100 ms-and-more backoff of a
// failing database (issue 24: a killed idle connection made every event
// of the moment wait for that backoff, and pgxpool pings only connections
// idle for over a second).
func TestLostIdleConnectionsRetriedAtOnce(t *testing.T) {
	t.Parallel()
	admin, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	app := outboxtest.UniqueName(t, "relay")
	pool := relayPoolThrough(t, nil, app)
	logs := newLogRecorder()
	cfg := quietConfig(schema, b.pub)
	cfg.PollInterval, cfg.DisableNotify = time.Hour, true // only Wake starts a round
	cfg.HeartbeatInterval, cfg.LaneSweepInterval, cfg.VacuumInterval = outbox.RelayHeartbeatLifetimeMax/3, time.Hour, -1
	cfg.Logger = slog.New(logs)
	r, stop := startRelay(t, pool, cfg)
	defer stop()
	published := func(n int64) func() bool { return func() bool { return r.Stats().Published == n } }
	writeEventsFor(t, admin, w, "a", "b", "c")
	r.Wake()
	outboxtest.Eventually(t, 10*time.Second, "a, b, c published", published(3))
	endSessions(t, admin, app)
	writeEventsFor(t, admin, w, "d")
	r.Wake()
	outboxtest.Eventually(t, 10*time.Second, "d published on a fresh connection", published(4))
	waits := logs.durations("relay batch failed", "retry_in")
	if len(waits) == 0 {
		t.Fatalf("no round met a dead connection: %s", logs)
	}
	for _, d := range waits {
		if d > 10*time.Millisecond {
			t.Fatalf("a round that lost its connection waited %s before the next, want 10ms (all: %v)", d, waits)
		}
	}
}

// TestListenComesBackAfterItsSessionEnds ends the relay's LISTEN session:
// it must listen again, so that a commit after that wakes it. Its poll
// interval is an hour, so only a wake-up can publish the event.
func TestListenComesBackAfterItsSessionEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, schema := outboxtest.Schema(t)
	w := newWriter(t, schema)
	b := newNATS(t, outboxtest.NATSURL(), 0)
	app := outboxtest.UniqueName(t, "relay")
	pool := relayPoolThrough(t, nil, app)
	cfg := quietConfig(schema, b.pub)
	cfg.PollInterval = time.Hour
	_, stop := startRelay(t, pool, cfg)
	defer stop()
	listening := func() int {
		var pid int
		_ = admin.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'`, app).Scan(&pid)
		return pid
	}
	outboxtest.Eventually(t, 10*time.Second, "the relay listens", func() bool { return listening() != 0 })
	first := listening()
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, first); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	outboxtest.Eventually(t, 10*time.Second, "the relay listens again", func() bool { pid := listening(); return pid != 0 && pid != first })
	t.Logf("listening again %s after its session ended", time.Since(start).Round(time.Millisecond))
	n, err := outbox.NewNotifier(admin, outbox.NotifierConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	writeEventsFor(t, admin, w, "woken")
	n.Notify()
	outboxtest.Eventually(t, 10*time.Second, "the event published on the wake-up", func() bool { return unpublished(t, admin, schema) == 0 })
}

func hostPortOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
