package chaos

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/internal/pgcluster"
	"github.com/pgoutbox/outbox/outboxmigrate"
)

// background runs the driver until stop is called (which waits for it).
func background(e *env, d *Driver, clients int, rate float64) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx, clients, rate, 0)
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	e.t.Cleanup(stop)
	return stop
}

// waitApplied waits until at least n events were applied by the consumers.
func (e *env) waitApplied(n int64) {
	e.t.Helper()
	outboxtest.Eventually(e.t, 60*time.Second, "events applied", func() bool {
		return e.queryInt(`SELECT count(*) FROM {s}.processed_events`) >= n
	})
}

// TestBrokerRestartAndOutage stops the broker (a nats-server process of the
// test's own) while orders keep coming: the relays back off without spending
// the events' attempts; when the broker is back on the same port and
// storage, the events flow, nothing is lost or reordered.
func TestBrokerRestartAndOutage(t *testing.T) {
	t.Parallel()
	broker, err := NewBroker(NATSServerPath(), t.TempDir(), logSink(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := broker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = broker.Stop() })
	e := newEnv(t, envOptions{dest: broker.URL(), relays: 2})
	e.startAll(nil)
	d := e.driver()
	stop := background(e, d, 2, 20)
	e.waitApplied(10)

	if err := broker.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker stopped")
	// The relays notice and back off; events pile up meanwhile.
	for _, r := range []string{"relay-1", "relay-2"} {
		if _, err := e.sys.Process(r).WaitLine(ctx, regexp.MustCompile(`destination unavailable.*consecutive=4`)); err != nil {
			t.Fatal(err)
		}
	}
	// An outage is the destination's state: the events wait untouched (no
	// last_error, no attempt, available_at not pushed; issue 19 item 7).
	outboxtest.Eventually(t, 60*time.Second, "events waiting during the outage", func() bool {
		return e.queryInt(`SELECT count(*) FROM {s}.outbox_events WHERE published_at IS NULL`) >= 5
	})
	if n := e.queryInt(`SELECT coalesce(sum(attempt_count), 0) + count(quarantined_at) FROM {s}.outbox_events WHERE published_at IS NULL`); n != 0 {
		t.Fatalf("the outage spent %d attempts or quarantined events", n)
	}
	if err := broker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker restarted")
	committed := d.Ledger.Committed()
	outboxtest.Eventually(t, 60*time.Second, "orders after the restart", func() bool { return d.Ledger.Committed() >= committed+10 })
	stop()
	r := e.converge(d)
	if r.Events < 20 {
		t.Fatalf("only %d events", r.Events)
	}
}

// TestPostgresRestartUnderRelay crashes a private PostgreSQL cluster
// (immediate shutdown) under the running API, relay and consumer, keeps it
// down a while, and starts it again: every process reconnects by itself and
// every invariant holds.
func TestPostgresRestartUnderRelay(t *testing.T) {
	t.Parallel()
	pg := outboxtest.PrivateCluster(t, pgcluster.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pg.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := outboxtest.UniqueName(t, "t")
	if _, err := outboxmigrate.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{pool: pool, databaseURL: pg.URL(""), schema: schema})
	e.startAll(nil)
	d := e.driver()
	stop := background(e, d, 2, 20)
	e.waitApplied(10)

	if err := pg.Crash(); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL stopped (immediate)")
	// Down for a while: the relay backs off several times, the API fails
	// requests (the driver retries them with their keys).
	outboxtest.Eventually(t, 60*time.Second, "the relay backed off while PostgreSQL was down", func() bool {
		return e.sys.Process("relay-1").CountLines("relay batch failed") >= 4
	})
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL started again")
	committed := d.Ledger.Committed()
	outboxtest.Eventually(t, 90*time.Second, "orders after the restart", func() bool { return d.Ledger.Committed() >= committed+10 })
	stop()
	e.converge(d)
	for _, n := range e.sys.Names() {
		if running, inc, _, _ := e.sys.State(n); !running || inc != 1 {
			t.Errorf("%s: running %v, incarnation %d; want the first, still running", n, running, inc)
		}
	}
}

// TestRelayPausedPastLease freezes a relay (SIGSTOP) after the broker
// acknowledged its batch and before it marked it; a second relay takes the
// events over once the lease expired, republishes and marks them. When the
// first relay continues (SIGCONT), its marks are refused by the claim token:
// it counts them as lease conflicts and the new owner's rows stay as they
// are.
func TestRelayPausedPastLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{relays: 2})
	e.startAll(nil, "relay-1", "relay-2")
	d := e.driver()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d.Run(ctx, 1, 0, 15)
	e.start("relay-1", "relay/after-ack-before-mark=sleep(3s)@1") // its first batch is the backlog

	r1 := e.sys.Process("relay-1")
	if _, err := r1.WaitLine(ctx, regexp.MustCompile(`failpoint relay/after-ack-before-mark: sleep`)); err != nil {
		t.Fatal(err)
	}
	if !e.sys.Pause("relay-1") {
		t.Fatal("relay-1 could not be paused")
	}
	var held []uuid.UUID
	rows, err := e.pool.Query(ctx, `SELECT event_id FROM `+pgx.Identifier{e.where.Schema, "outbox_events"}.Sanitize()+`
WHERE claimed_by = 'relay-1.1' AND published_at IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	if held, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil || len(held) == 0 {
		t.Fatalf("relay-1 holds %d events (%v); want its acknowledged batch", len(held), err)
	}
	t.Logf("relay-1 paused holding %d claimed events, some acknowledged by the broker, none marked", len(held))

	e.start("relay-2", "")
	type rowState struct {
		publishedAt time.Time
		claimedBy   *string
		token       *uuid.UUID
	}
	snapshot := func() map[uuid.UUID]rowState {
		out := map[uuid.UUID]rowState{}
		rows, err := e.pool.Query(ctx, `SELECT event_id, published_at, claimed_by, claim_token FROM `+
			pgx.Identifier{e.where.Schema, "outbox_events"}.Sanitize()+` WHERE event_id = ANY($1) AND published_at IS NOT NULL`, held)
		if err != nil {
			t.Fatal(err)
		}
		var id uuid.UUID
		var s rowState
		if _, err := pgx.ForEachRow(rows, []any{&id, &s.publishedAt, &s.claimedBy, &s.token}, func() error { out[id] = s; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	outboxtest.Eventually(t, 60*time.Second, "relay-2 took over and marked relay-1's events", func() bool { return len(snapshot()) == len(held) })
	before := snapshot()

	e.sys.Resume("relay-1")
	// Every write-back of the stale relay is refused: its marks of what the
	// broker had acknowledged, and the release of what it had not sent yet.
	conflicts := regexp.MustCompile(`lease lost.*op="?([a-z ]+)"? events=(\d+)`)
	var marks, total int
	outboxtest.Eventually(t, 60*time.Second, "relay-1's stale write-backs refused", func() bool {
		marks, total = 0, 0
		for _, l := range r1.Lines() {
			if m := conflicts.FindStringSubmatch(l); m != nil {
				n, _ := strconv.Atoi(m[2])
				total += n
				if m[1] == "mark published" {
					marks += n
				}
			}
		}
		return total == len(held)
	})
	t.Logf("relay-1 after SIGCONT: %d lease conflicts (%d marks refused)", total, marks)
	if marks == 0 {
		t.Error("relay-1 attempted no stale mark")
	}
	after := snapshot()
	for id, b := range before {
		a := after[id]
		if !a.publishedAt.Equal(b.publishedAt) || a.claimedBy != nil || a.token != nil {
			t.Errorf("event %s changed after the stale relay resumed: %+v -> %+v", id, b, a)
		}
	}
	e.converge(d)
}
