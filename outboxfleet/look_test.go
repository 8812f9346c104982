package outboxfleet_test

import (
	"context"
	"fmt"
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

// lookSeen records the looks' statements (a tracer on every connection of
// the database) and the pool's connections (their backends' pids).
type lookSeen struct {
	mu    sync.Mutex
	pool  map[uint32]bool
	looks []lookStatement
}

type lookStatement struct {
	at     time.Time
	pid    uint32
	sql    string
	inPool bool
}

func (l *lookSeen) afterConnect(_ context.Context, c *pgx.Conn) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pool[c.PgConn().PID()] = true
	return nil
}

func (l *lookSeen) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	// The look's statement (look.go's lookStatement).
	if strings.HasPrefix(d.SQL, "SELECT 0 WHERE EXISTS (SELECT 1 FROM ") {
		l.mu.Lock()
		pid := c.PgConn().PID()
		l.looks = append(l.looks, lookStatement{at: time.Now(), pid: pid, sql: d.SQL, inPool: l.pool[pid]})
		l.mu.Unlock()
	}
	return ctx
}

func (l *lookSeen) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *lookSeen) statements() []lookStatement {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lookStatement(nil), l.looks...)
}

// busyClaims records when a source's relay was busy: from the end of its
// first claim that found events to the end of its first claim after that
// which found none and had no more to read (a background full scan that
// found nothing, followed at once by a claim, does not count). It passes
// the claims on to the fleet's observer.
type busyClaims struct {
	next       outbox.ClaimObserver
	mu         sync.Mutex
	from, till time.Time
	claims     int
}

func (b *busyClaims) ObserveClaim(o outbox.ClaimObservation) {
	if o.Err == nil && o.Events == 0 && !o.More && !o.FullScan {
		// Before the fleet sees it: a look after this may name the source.
		b.mu.Lock()
		if !b.from.IsZero() && b.till.IsZero() {
			b.till = time.Now()
		}
		b.mu.Unlock()
	}
	b.next.ObserveClaim(o)
	if o.Err == nil && o.Events > 0 {
		b.mu.Lock()
		if b.from.IsZero() {
			b.from = time.Now()
		}
		if b.till.IsZero() {
			b.claims++
		}
		b.mu.Unlock()
	}
}

func (b *busyClaims) window() (from, till time.Time, claims int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.from, b.till, b.claims
}

// slowPublisher takes delay for each call (a slow destination, or a
// server too loaded to claim quickly): each of the busy source's batches
// then takes several poll intervals.
type slowPublisher struct {
	outbox.Publisher
	delay time.Duration
}

func (p slowPublisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	t := time.NewTimer(p.delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestFleetLookLeavesABusySourceAlone: one source drains a backlog whose
// every batch takes four poll intervals (a slow destination), beside a quiet
// source written to without NOTIFY. While the busy source's claims find
// events, the look never names it (its relay claims again on its own; the
// look's statement over a large backlog cost seconds in
// TestFleetFigureIsolation), and no look ever runs on a connection of the
// shared pool (where another source's claim would wait for it); the quiet
// source's event, found by the look, goes out all the same.
func TestFleetLookLeavesABusySourceAlone(t *testing.T) {
	t.Parallel()
	admin := outboxtest.Pool(t)
	prefix := outboxtest.UniqueName(t, "lk")
	busy, quiet := prefix+"_busy", prefix+"_quiet"
	migrateSchemas(t, admin, busy, quiet)
	st := newStream(t)
	var w written
	// The backlog is written before the fleet starts: the busy source's
	// first claim finds events. Each event is an aggregate of its own, so
	// that no claim finds only events behind a head still being published.
	w.write(t, admin, busy, "order", 1200, 1)
	const poll = 50 * time.Millisecond
	cfg, err := outboxfleet.Parse([]byte(fmt.Sprintf(`
relay: {poll_interval: 50ms, discover_interval: 200ms, idle_max: 30s, batch_size: 50}
databases:
  main: {url: %q, max_conns: 4}
destinations:
  events: {url: "nats://unused"}
sources:
  - {database: main, schema_pattern: "%s_*", destination: events}
`, outboxtest.DatabaseURL(), prefix)))
	if err != nil {
		t.Fatal(err)
	}
	seen := &lookSeen{pool: map[uint32]bool{}}
	claims := &busyClaims{}
	runFleet(t, cfg, outboxfleet.Options{
		OpenDestination: publishers(map[string]outbox.Publisher{"events": st.pub}),
		ConfigurePool: func(pc *pgxpool.Config) {
			pc.AfterConnect = seen.afterConnect
			pc.ConnConfig.Tracer = seen
		},
		ConfigureRelay: func(source string, rc *outbox.RelayConfig) {
			if strings.HasSuffix(source, "/"+busy) {
				claims.next = rc.Observer.(outbox.ClaimObserver)
				rc.Observer = claims
				rc.Publisher = slowPublisher{Publisher: rc.Publisher, delay: 4 * poll}
			}
		},
	})
	waitFor(t, 60*time.Second, "the busy source's first batch claimed", func() bool {
		from, _, _ := claims.window()
		return !from.IsZero()
	})
	// The quiet source's event, written without NOTIFY while the backlog
	// drains: only the look finds it.
	w.write(t, admin, quiet, "order", 1, 1)
	waitFor(t, 60*time.Second, "the quiet source's event published", func() bool { return unpublishedIn(t, admin, quiet) == 0 })
	quietOut := time.Now()
	waitFor(t, 300*time.Second, "the backlog drained", func() bool { return unpublishedIn(t, admin, busy) == 0 })
	waitFor(t, 60*time.Second, "the busy source's relay idle again", func() bool {
		_, till, _ := claims.window()
		return !till.IsZero()
	})

	from, till, n := claims.window()
	if !quietOut.Before(till) {
		t.Fatal("the quiet source's event went out after the backlog drained: the test proves nothing (make the backlog larger)")
	}
	if till.Sub(from) < 10*poll || n < 5 {
		t.Fatalf("the busy source was busy for %s (%d claims): the test proves nothing (make the backlog larger)", till.Sub(from), n)
	}
	var during, quietLooks, inPool, atBusy int
	var firstInPool, firstAtBusy string
	for _, l := range seen.statements() {
		if l.inPool {
			if inPool++; inPool == 1 {
				firstInPool = fmt.Sprintf("backend %d: %.100s", l.pid, l.sql)
			}
		}
		if l.at.Before(from) || !l.at.Before(till) {
			continue
		}
		during++
		if strings.Contains(l.sql, quiet) {
			quietLooks++
		}
		if strings.Contains(l.sql, busy) {
			if atBusy++; atBusy == 1 {
				firstAtBusy = fmt.Sprintf("%s after its first claim that found events, %s before its relay found none: %.100s",
					l.at.Sub(from).Round(time.Millisecond), till.Sub(l.at).Round(time.Millisecond), l.sql)
			}
		}
	}
	if inPool > 0 {
		t.Errorf("%d looks ran on a connection of the shared pool, where a source's claim waits for them; the first: %s", inPool, firstInPool)
	}
	if atBusy > 0 {
		t.Errorf("%d of %d looks while the busy source's claims found events named it; the first %s", atBusy, during, firstAtBusy)
	}
	if quietLooks == 0 {
		t.Fatalf("no look named the quiet source while the busy one drained (%d looks): the test proves nothing", during)
	}
	t.Logf("busy for %s (%d claims that found events); %d looks meanwhile, %d of them at the quiet source", till.Sub(from).Round(time.Millisecond), n, during, quietLooks)
	w.checkDelivered(t, st.messages(t), nil)
}
