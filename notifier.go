package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// Defaults for NotifierConfig.
const (
	// NotifyTimeoutDefault bounds one wake-up NOTIFY sent by a Notifier.
	NotifyTimeoutDefault = 5 * time.Second
	// NotifyIntervalDefault is the shortest time between two NOTIFYs of a
	// Notifier.
	NotifyIntervalDefault = 5 * time.Millisecond
)

// NotifierConfig configures a Notifier.
type NotifierConfig struct {
	// Schema is the PostgreSQL schema whose relays are woken, as a plain
	// string: the older field, kept working; prefer Tables. Defaults to
	// "outbox".
	Schema string
	// Tables is the schema holding the outbox tables, whose relays are
	// woken: the one Schema value an application gives every component's
	// config (see outbox.Schema). Setting it and Schema to different names
	// is refused (ErrSchemaConflict). Defaults to Schema, then "outbox".
	Tables Schema
	// Timeout bounds each NOTIFY. Defaults to NotifyTimeoutDefault.
	Timeout time.Duration
	// Interval is the shortest time between the start of two NOTIFYs: under
	// a stream of commits the notifier sends at most one per Interval (each
	// still after the commits it covers), instead of one per round trip.
	// Defaults to NotifyIntervalDefault; a negative value means no pause.
	Interval time.Duration
	// Logger receives a warning when a NOTIFY fails. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Notifier wakes the relays of a schema after commits, off the caller's
// path and coalesced: Notify never blocks and never touches the caller's
// transaction; while one NOTIFY is in flight, any number of further Notify
// calls cause exactly one more, sent after it (and at least Interval after
// the previous one started). So every Notify is followed by a NOTIFY issued
// after it (a relay woken by it sees the caller's commit), a burst of
// commits costs two NOTIFYs, and a steady stream at most one per Interval.
//
// Call Notify after the transaction that recorded events has committed. A
// NOTIFY inside the writing transaction would take a database-wide lock at
// commit and serialise all committing writers; a Notifier keeps that off the
// write path. Wake-ups are an optimisation only: relays poll anyway, so a
// failed NOTIFY only delays publication until the next poll.
//
// A Notifier is safe for concurrent use. Close it when done.
type Notifier struct {
	db       Execer
	channel  string
	timeout  time.Duration
	interval time.Duration
	log      *slog.Logger

	mu                  sync.Mutex
	running, again      bool
	closed              bool
	idle                *sync.Cond // signalled when running becomes false
	ctx                 context.Context
	cancel              context.CancelFunc
	sent, failed, calls int64
}

// notifySQL sends the wake-up in a transaction of its own whose commit does
// not wait for the WAL flush (set_config(..., true) applies to this
// statement's transaction only): a NOTIFY carries no data, and one lost in a
// database crash only delays publication until the relays' next poll. So
// wake-ups add no fsync to the writers' group commits.
const notifySQL = "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')"

// NewNotifier returns a Notifier that sends its NOTIFYs through db, usually
// the application's *pgxpool.Pool.
func NewNotifier(db Execer, cfg NotifierConfig) (*Notifier, error) {
	if db == nil {
		return nil, fmt.Errorf("outbox: NewNotifier needs a database")
	}
	s, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: notifier: %w", err)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("outbox: notifier Timeout %s is negative", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = NotifyTimeoutDefault
	}
	switch {
	case cfg.Interval == 0:
		cfg.Interval = NotifyIntervalDefault
	case cfg.Interval < 0:
		cfg.Interval = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Notifier{db: db, channel: NotifyChannel(s.Name()), timeout: cfg.Timeout, interval: cfg.Interval,
		log: cfg.Logger, ctx: ctx, cancel: cancel}
	n.idle = sync.NewCond(&n.mu)
	return n, nil
}

// Notify asks for a wake-up of the relays. It returns at once.
func (n *Notifier) Notify() {
	n.mu.Lock()
	n.calls++
	if n.closed {
		n.mu.Unlock()
		return
	}
	if n.running {
		n.again = true
		n.mu.Unlock()
		return
	}
	n.running = true
	n.mu.Unlock()
	go n.loop()
}

func (n *Notifier) loop() {
	for {
		start := time.Now()
		ctx, cancel := context.WithTimeout(n.ctx, n.timeout)
		_, err := n.db.Exec(ctx, notifySQL, n.channel)
		cancel()
		n.mu.Lock()
		if err != nil {
			n.failed++
			if !n.closed {
				n.log.Warn("notify relays (they will find the events at their next poll)", slog.Any("error", err))
			}
		} else {
			n.sent++
		}
		if !n.again || n.closed {
			n.running, n.again = false, false
			n.idle.Broadcast()
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		// Calls that arrive during the pause are covered by the next NOTIFY,
		// which is sent after it.
		if wait := n.interval - time.Since(start); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-n.ctx.Done():
			}
			t.Stop()
		}
		n.mu.Lock()
		if n.closed {
			n.running, n.again = false, false
			n.idle.Broadcast()
			n.mu.Unlock()
			return
		}
		n.again = false
		n.mu.Unlock()
	}
}

// NotifierStats are a Notifier's running totals.
type NotifierStats struct {
	// Calls counts Notify calls.
	Calls int64
	// Sent counts NOTIFYs sent; Failed those that failed.
	Sent, Failed int64
}

// Stats returns the notifier's running totals.
func (n *Notifier) Stats() NotifierStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return NotifierStats{Calls: n.calls, Sent: n.sent, Failed: n.failed}
}

// Close stops the notifier: a NOTIFY in flight is finished (within its
// timeout), a pending one is dropped, and later Notify calls do nothing.
func (n *Notifier) Close() {
	n.mu.Lock()
	n.closed = true
	for n.running {
		n.idle.Wait()
	}
	n.mu.Unlock()
	n.cancel()
}
