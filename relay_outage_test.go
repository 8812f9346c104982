package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/outboxtest"
	"github.com/pgoutbox/outbox/outboxnats"
)

// steadyWriter commits one event per transaction, round robin over
// aggregates agg-0 … agg-(aggregates-1), every interval, and wakes the relays
// with a Notifier after each commit, until stop is called.
type steadyWriter struct {
	stop    func()
	done    chan struct{}
	written atomic.Int64
	err     atomic.Pointer[error]
}

func startSteadyWriter(t *testing.T, pool *pgxpool.Pool, schema string, aggregates int, interval time.Duration) *steadyWriter {
	t.Helper()
	w := newWriter(t, schema)
	n, err := outbox.NewNotifier(pool, outbox.NotifierConfig{Schema: schema, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sw := &steadyWriter{done: make(chan struct{})}
	sw.stop = func() { cancel(); <-sw.done }
	t.Cleanup(func() { sw.stop(); n.Close() })
	go func() {
		defer close(sw.done)
		tick := time.NewTicker(interval) // paces the load; nothing waits on it
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ev := orderEvent("agg-"+strconv.Itoa(i%aggregates), "Tick")
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.InsertTx(ctx, tx, ev); return err }); err != nil {
				if ctx.Err() == nil {
					sw.err.Store(&err)
				}
				return
			}
			sw.written.Add(1)
			n.Notify()
		}
	}()
	return sw
}

func (sw *steadyWriter) check(t *testing.T) {
	t.Helper()
	if p := sw.err.Load(); p != nil {
		t.Fatalf("writer: %v", *p)
	}
}

// TestBrokerOutageUnderLoadDelaysNothingPastItsEnd (issue 19, item 7): a
// two-second NATS outage while writers commit and wake the relay on every
// commit. An outage is the destination's state, not the events': the
// wake-ups do not end the relay's wait, no event spends an attempt or has
// its available_at pushed (a short delay at most), and once the broker is
// back the events that met the outage go out at once. The retry backoff is
// set to a minute, so that an event the outage had pushed onto it would be
// a minute late: the bound on the last event's delay after the broker's
// return (ten seconds) then tells the defect from a loaded machine.
func TestBrokerOutageUnderLoadDelaysNothingPastItsEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := outboxtest.Schema(t)
	dir := t.TempDir()
	srv, err := outboxnats.StartEmbedded(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	b := newNATS(t, url, 0)
	// The library's defaults (poll 1s, looks at the destination 1s apart at
	// most), wake-ups on; a failed event's retry a minute away at least.
	cfg := outbox.RelayConfig{Schema: schema, Publisher: b.pub, Logger: discardLogger(),
		RetryBackoffMin: time.Minute, RetryBackoffMax: 5 * time.Minute}
	r, _ := startRelay(t, pool, cfg)

	sw := startSteadyWriter(t, pool, schema, 50, 4*time.Millisecond)
	outboxtest.Eventually(t, 30*time.Second, "steady state: events flowing", func() bool {
		sw.check(t)
		return r.Stats().Published >= 100
	})

	srv.Shutdown()
	down := time.Now()
	outboxtest.Eventually(t, 30*time.Second, "the relay met the outage", func() bool { return r.Stats().Failed > 0 })
	time.Sleep(time.Until(down.Add(2 * time.Second))) // the outage's length, not a synchronisation
	srv2, err := outboxnats.StartEmbedded(dir, portOf(t, url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv2.Shutdown)
	up := time.Now()
	time.Sleep(time.Second) // writers go on for a second after the return
	sw.stop()
	sw.check(t)

	for deadline := time.Now().Add(60 * time.Second); unpublished(t, pool, schema) > 0; {
		if time.Now().After(deadline) {
			var left, attempts int
			var pushed time.Duration
			if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(attempt_count), 0),
				coalesce(max(extract(epoch FROM available_at - occurred_at)), 0) * interval '1 second'
				FROM `+schema+`.outbox_events WHERE published_at IS NULL`).Scan(&left, &attempts, &pushed); err != nil {
				t.Fatal(err)
			}
			t.Fatalf("%d events still unpublished a minute after the broker's return (%d written): at most %d attempts spent, available_at pushed up to %s past the commit",
				left, sw.written.Load(), attempts, pushed.Round(time.Second))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// At the destination: when each event written during the outage was
	// stored.
	stored := map[uuid.UUID]time.Time{}
	for _, m := range b.streamRaw(t) {
		if _, ok := stored[m.msg.ID]; !ok {
			stored[m.msg.ID] = m.at
		}
	}
	rows, err := pool.Query(ctx, `SELECT event_id, occurred_at, available_at, attempt_count FROM `+schema+`.outbox_events`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id                  uuid.UUID
		occurred, available time.Time
		attempts            int
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.occurred, &x.available, &x.attempts)
	})
	if err != nil {
		t.Fatal(err)
	}
	var during []time.Duration // commit to stored, for the events written during the outage
	var latest time.Time
	for _, e := range evs {
		at, ok := stored[e.id]
		if !ok {
			t.Fatalf("event %s published but not in the stream", e.id)
		}
		if e.attempts != 0 {
			t.Errorf("event %s spent %d attempts on an outage", e.id, e.attempts)
		}
		// Released events are due again at once (available_at moves to the
		// moment of the release, so that the incremental claim finds them:
		// docs/design.md, "Claiming only what is new"), never later: a push
		// onto the retry backoff is a minute at least, so a slack of 30 s
		// past the outage tells it from a loaded machine's late release.
		if pushed := e.available.Sub(e.occurred); pushed > up.Sub(down)+30*time.Second {
			t.Errorf("event %s: available_at pushed %s past its commit by the outage", e.id, pushed.Round(time.Millisecond))
		}
		if e.occurred.After(down) && e.occurred.Before(up) {
			during = append(during, at.Sub(e.occurred))
			if at.After(latest) {
				latest = at
			}
		}
	}
	if len(during) < 50 {
		t.Fatalf("only %d events written during the outage", len(during))
	}
	sort.Slice(during, func(i, j int) bool { return during[i] < during[j] })
	t.Logf("%d events written during the %s outage: commit to stored p50 %s, p99 %s, max %s; the last stored %s after the broker's return",
		len(during), up.Sub(down).Round(time.Millisecond), during[len(during)/2].Round(time.Millisecond),
		during[len(during)*99/100].Round(time.Millisecond), during[len(during)-1].Round(time.Millisecond), latest.Sub(up).Round(time.Millisecond))
	if late := latest.Sub(up); late > 10*time.Second {
		t.Errorf("the last event written during the outage was stored %s after the broker's return, want within 10s (a retry is a minute away)", late.Round(time.Millisecond))
	}
	checkBrokerOrder(t, b.streamEvents(t))
}

// storedMsg is a stream message with the time the server stored it.
type storedMsg struct {
	msg outbox.Message
	at  time.Time
}

// streamRaw reads the whole stream back, in stream order, with the times
// the messages were stored.
func (b natsBundle) streamRaw(t *testing.T) []storedMsg {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []storedMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get stream message %d: %v", seq, err)
		}
		m, err := outboxnats.Decode(raw.Header, raw.Data)
		if err != nil {
			t.Fatalf("decode stream message %d: %v", seq, err)
		}
		out = append(out, storedMsg{m, raw.Time})
	}
	return out
}

// logRecorder is a slog.Handler that keeps the messages logged at warning
// level and above.
type logRecorder struct {
	mu   *sync.Mutex
	msgs *[]string
	recs *[]slog.Record
}

func newLogRecorder() logRecorder {
	return logRecorder{mu: new(sync.Mutex), msgs: new([]string), recs: new([]slog.Record)}
}

func (h logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.msgs = append(*h.msgs, r.Message)
	*h.recs = append(*h.recs, r.Clone())
	return nil
}

// durations returns the value of attribute key of every record of msg.
func (h logRecorder) durations(msg, key string) []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Duration
	for _, r := range *h.recs {
		if r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				out = append(out, a.Value.Duration())
			}
			return true
		})
	}
	return out
}
func (h logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logRecorder) WithGroup(string) slog.Handler      { return h }

func (h logRecorder) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range *h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func (h logRecorder) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprint(*h.msgs)
}
