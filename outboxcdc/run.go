package outboxcdc

// Running: set-up, streaming with reconnection, standing by while another
// process streams the slot, recreating a slot PostgreSQL invalidated, and
// the polling safety net beside it all.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// Stats are a CDC relay's running totals.
type Stats struct {
	received, published, left, outages, invalidations, takeovers atomic.Int64
	alreadyPublished, deferred, rewinds, standbyChecks           atomic.Int64
	queued, waiting                                              atomic.Int64
	confirmed                                                    atomic.Uint64
	streaming, standby                                           atomic.Bool
}

// Received counts the event ids read from committed transactions (an id
// read again after a restart or a rewind counts again).
func (s *Stats) Received() int64 { return s.received.Load() }

// Published counts the events PublishIDs published.
func (s *Stats) Published() int64 { return s.published.Load() }

// AlreadyPublished counts the ids read whose event was found published
// already: read again after a restart, or published by another relay.
func (s *Stats) AlreadyPublished() int64 { return s.alreadyPublished.Load() }

// Left counts the ids the stream left to the polling path (the safety
// net) without finding them published: parked behind a quarantine, still
// blocked after Config.WaitLimit, or not found in the table for a second.
func (s *Stats) Left() int64 { return s.left.Load() }

// Queued is the number of ids read and not finished now (at most
// Config.MaxQueued).
func (s *Stats) Queued() int64 { return s.queued.Load() }

// Waiting is the number of ids, among Queued, that a call did not publish
// and that wait to be handed over again (see Config.WaitLimit).
func (s *Stats) Waiting() int64 { return s.waiting.Load() }

// Deferred counts the ids read and not queued because Config.MaxQueued ids
// were held; their transactions are read again (see Rewinds).
func (s *Stats) Deferred() int64 { return s.deferred.Load() }

// Rewinds counts the times the stream started again from the slot's
// confirmed position to read deferred transactions again.
func (s *Stats) Rewinds() int64 { return s.rewinds.Load() }

// StandbyChecks counts the times this relay, standing by, looked whether
// its slot was free.
func (s *Stats) StandbyChecks() int64 { return s.standbyChecks.Load() }

// Outages counts the PublishIDs calls that found the destination
// unavailable (the stream then keeps its position and retries).
func (s *Stats) Outages() int64 { return s.outages.Load() }

// Takeovers counts the times this relay started streaming after standing
// by.
func (s *Stats) Takeovers() int64 { return s.takeovers.Load() }

// Invalidations counts the times the slot was found invalidated and
// recreated.
func (s *Stats) Invalidations() int64 { return s.invalidations.Load() }

// Streaming reports whether this relay is streaming the slot now (false
// while it stands by or reconnects).
func (s *Stats) Streaming() bool { return s.streaming.Load() }

// StandingBy reports whether this relay stands by now: another process
// streams its slot.
func (s *Stats) StandingBy() bool { return s.standby.Load() }

// Confirmed is the last position reported to PostgreSQL as flushed.
func (s *Stats) Confirmed() pglogrepl.LSN { return pglogrepl.LSN(s.confirmed.Load()) }

// Relay is a change-data-capture relay: see the package documentation.
type Relay struct {
	cfg     Config
	log     *slog.Logger
	stats   Stats
	started atomic.Bool
	lastErr atomic.Pointer[error] // why the stream last ended
	// sender is the PID of the WAL sender of this relay's last replication
	// connection (Run's goroutine only): found still holding the slot after
	// that connection closed, it is this relay's own, exiting, not another
	// process to stand by for.
	sender int
	// legacyLogged: Run said once that it streams a slot under an earlier
	// version's name.
	legacyLogged bool
}

// setLastErr records why the stream last ended, for Ready. It stores a
// copy: Run goes on changing its own err (errors.Join of what a repair
// found), which Ready, on another goroutine, must not see half-written.
func (r *Relay) setLastErr(err error) {
	e := err
	r.lastErr.Store(&e)
}

// Ready reports whether the relay does its job: nil while it streams the
// slot or stands by for another process that does; otherwise why not (not
// started, stopped, or the error that ended its last stream while it
// reconnects). It does not cover the safety net (see outbox.Relay.Ready).
func (r *Relay) Ready() error {
	switch {
	case r.stats.streaming.Load() || r.stats.standby.Load():
		return nil
	case !r.started.Load():
		return errors.New("cdc relay not running")
	}
	if p := r.lastErr.Load(); p != nil {
		return fmt.Errorf("cdc stream reconnecting: %w", *p)
	}
	return errors.New("cdc stream starting")
}

// New validates cfg and returns a CDC relay. Run starts it.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, log: cfg.Logger.With(slog.String("slot", cfg.Slot))}, nil
}

// Stats returns the relay's running totals (live: read them any time).
func (r *Relay) Stats() *Stats { return &r.stats }

// Run sets up the publication and the slot (Setup), then streams the slot
// until ctx ends, and runs cfg.SafetyNet beside it when set. A connection
// that fails is opened again after a backoff; while another process streams
// the slot, Run stands by and takes over when that process's connection
// ends; a slot PostgreSQL invalidated is dropped and created again at the
// current position. Set-up errors are retried too, except those retrying
// cannot fix (wal_level, a slot or publication of the name that is not
// ours, a missing right), which Run returns. The safety net runs from the
// start, whatever the stream does. Run returns nil when ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	r.started.Store(true)
	defer r.started.Store(false)
	// The safety net runs from the start: events are published even while
	// the stream cannot be set up.
	var wg sync.WaitGroup
	defer wg.Wait()
	netCtx, stopNet := context.WithCancel(ctx)
	defer stopNet()
	if r.cfg.SafetyNet != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.cfg.SafetyNet.Run(netCtx); err != nil {
				r.log.Error("polling safety net stopped", slog.Any("error", err))
			}
		}()
	}
	for failures := 1; ; failures++ {
		err := r.cfg.resolveSlot(ctx)
		if err == nil && r.cfg.legacySlot && !r.legacyLogged {
			r.legacyLogged = true
			r.log.Warn("streaming the slot under the name an earlier version gave it; the name now ends with a hash, because names joined with _ could be the same for two schemas (outboxcdc.SlotName)",
				slog.String("slot_streamed", r.cfg.Slot), slog.String("name_now", SlotName(r.cfg.Schema, r.cfg.Group)))
		}
		if err == nil {
			err = Setup(ctx, r.cfg)
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
		case fatal(err):
			return err
		default:
			r.setLastErr(err)
			d := jitter(failures, r.cfg.RetryMin, r.cfg.RetryMax)
			r.log.Warn("cdc set-up failed; retrying", slog.Any("error", err), slog.Duration("retry_in", d))
			sleep(ctx, d)
			continue
		}
		break
	}
	r.log.Info("cdc relay started", slog.String("publication", r.cfg.Publication), slog.String("schema", r.cfg.Schema))
	failures, standby, own := 0, false, 0
	for ctx.Err() == nil {
		err := r.streamOnce(ctx, standby)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, errOwnSender) {
			// The WAL sender of the connection this relay just closed (a
			// rewind, a reconnection) has not released the slot yet: wait
			// for it briefly, neither standing by nor counting a takeover.
			standby = false
			r.stats.standby.Store(false)
			own++
			sleep(ctx, jitter(own, ownSenderWait, r.cfg.StandbyInterval))
			continue
		}
		own = 0
		if errors.Is(err, errRewind) {
			// This relay streamed: reading again is not a takeover.
			standby = false
			r.stats.rewinds.Add(1)
			r.log.Info("cdc queue was full; reading the transactions it did not queue again from the slot's confirmed position",
				slog.Int64("deferred_events", r.stats.deferred.Load()))
			failures = 0
			continue
		}
		if err != nil {
			r.setLastErr(err)
		}
		var active *errSlotActive
		if errors.As(err, &active) || isCode(err, "55006") { // object_in_use: the slot is active for another PID
			if !standby {
				attrs := []any{}
				if active != nil {
					attrs = append(attrs, slog.Int("active_pid", active.pid))
				}
				r.log.Info("standing by: another process streams the slot", attrs...)
			}
			standby = true
			r.stats.standby.Store(true)
			failures = 0
			sleep(ctx, jitter(1, r.cfg.StandbyInterval, r.cfg.StandbyInterval))
			continue
		}
		standby = false
		r.stats.standby.Store(false)
		if fatal(err) {
			return err
		}
		if isCode(err, "42704") { // undefined_object: the slot, or the publication
			// A publication dropped by hand (and perhaps created again) fails
			// every session: the WAL sender looks it up as of the WAL it
			// decodes, before it existed again. Both are created again at the
			// current position, as for an invalidated slot.
			r.log.Error("the stream's publication or slot does not exist (dropped by hand?); creating them again at the current position: events committed meanwhile are published by the polling safety net, none is lost",
				slog.String("publication", r.cfg.Publication), slog.Any("error", err))
			if perr := ensurePublication(ctx, r.cfg.Pool, r.cfg.Schema, r.cfg.Publication); perr != nil {
				err = errors.Join(err, perr)
			} else if serr := recreateLostSlot(ctx, r.cfg.Pool, r.cfg.Slot); serr != nil {
				err = errors.Join(err, serr)
			} else {
				failures = 0
				continue
			}
		}
		if lost, lerr := r.recoverSlot(ctx); lerr != nil {
			err = errors.Join(err, lerr)
		} else if lost {
			failures = 0
			continue
		}
		failures++
		d := jitter(failures, r.cfg.RetryMin, r.cfg.RetryMax)
		r.log.Warn("cdc stream ended; reconnecting", slog.Any("error", err), slog.Duration("retry_in", d))
		sleep(ctx, d)
	}
	r.stats.standby.Store(false)
	r.log.Info("cdc relay stopped", slog.Int64("published", r.stats.published.Load()), slog.String("confirmed", r.stats.Confirmed().String()))
	return nil
}

// fatal reports an error that retrying cannot fix: the server's wal_level,
// a slot or publication of that name that is not ours, a missing right.
func fatal(err error) bool {
	return errors.Is(err, ErrWALLevel) || errors.Is(err, errForeignSlot) || errors.Is(err, errForeignPublication) ||
		isCode(err, "42501") // insufficient_privilege
}

var (
	errForeignSlot        = errors.New("not a pgoutput slot of this database")
	errForeignPublication = errors.New("does not publish the outbox table")
)

// recoverSlot looks at the slot after its stream ended: a slot PostgreSQL
// invalidated (wal_status lost: it needed WAL beyond
// max_slot_wal_keep_size) is dropped and created again at the current
// position; a slot that disappeared is created again. It reports whether it
// did either.
func (r *Relay) recoverSlot(ctx context.Context) (bool, error) {
	info, err := slotInfo(ctx, r.cfg.Pool, r.cfg.Slot)
	switch {
	case err != nil:
		return false, err
	case info.exists && info.walStatus == "lost":
		r.stats.invalidations.Add(1)
		r.log.Error("replication slot invalidated by PostgreSQL (it needed WAL past max_slot_wal_keep_size); recreating it at the current position: events committed meanwhile are published by the polling safety net, none is lost")
		return true, recreateLostSlot(ctx, r.cfg.Pool, r.cfg.Slot)
	case !info.exists:
		r.log.Warn("replication slot missing; creating it at the current position: events committed meanwhile are published by the polling safety net")
		_, err := ensureSlot(ctx, r.cfg.Pool, r.cfg.Slot)
		return true, err
	}
	return false, nil
}

// streamOnce opens a replication connection, starts streaming the slot from
// its confirmed position and runs the stream until it fails or ctx ends.
func (r *Relay) streamOnce(ctx context.Context, wasStandby bool) error {
	info, err := slotInfo(ctx, r.cfg.Pool, r.cfg.Slot)
	if err != nil {
		return err
	}
	if info.exists && (info.plugin != "pgoutput" || !info.sameDatabase) {
		return fmt.Errorf("outboxcdc: replication slot %s: %w", r.cfg.Slot, errForeignSlot)
	}
	if !info.exists || info.walStatus == "lost" {
		return errors.New("replication slot missing or invalidated")
	}
	if info.active {
		// Another process streams the slot, or the WAL sender of this
		// relay's last connection has not exited yet. START_REPLICATION
		// would fail, and write an ERROR to the server's log.
		if r.sender != 0 && info.activePID == r.sender {
			return errOwnSender
		}
		r.stats.standbyChecks.Add(1)
		return &errSlotActive{pid: info.activePID}
	}
	// Setup checked the publication at start; it may have been altered
	// since (ALTER PUBLICATION takes effect in the WAL sender at once).
	if _, err := checkPublication(ctx, r.cfg.Pool, r.cfg.Schema, r.cfg.Publication); err != nil {
		return err
	}
	pc, err := pgconn.ParseConfig(r.cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("outboxcdc: parse the database URL: %w", redact(err))
	}
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = "outbox-cdc " + r.cfg.Relay.ID()
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("outboxcdc: open the replication connection: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	// On a replication connection the backend is the WAL sender.
	r.sender = int(conn.PID())
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Publication + "'"},
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return pgErr
		}
		return fmt.Errorf("outboxcdc: start replication: %w", err)
	}
	r.stats.standby.Store(false)
	if wasStandby {
		r.stats.takeovers.Add(1)
		r.log.Info("took over the slot from the process that streamed it")
	}
	f := newFeed(info.confirmed, r.cfg.MaxQueued)
	pub, err := newPublisher(r.cfg, r.log, &r.stats, f)
	if err != nil {
		return err
	}
	s := &stream{cfg: r.cfg, conn: conn, log: r.log, st: &r.stats, f: f, rels: map[uint32]relation{}, confirmed: info.confirmed}
	r.log.Info("cdc streaming", slog.String("from", info.confirmed.String()), slog.String("restart_lsn", info.restart.String()))
	r.stats.streaming.Store(true)
	defer r.stats.streaming.Store(false)
	// The publisher runs beside the reader: the reader never waits for a
	// publish, and a publisher that fails (a failpoint) ends the session.
	sctx, stop := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := pub.run(sctx); err != nil {
			stop(err)
		}
	}()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		r.watchPublication(sctx, stop)
	}()
	err = s.run(sctx)
	stop(err)
	<-done
	<-watched
	r.stats.queued.Store(0)
	// The last call's marks may still be on their way (Relay.PublishIDs):
	// written before Run returns, so that a process that exits after it
	// leaves no acknowledged event to be published again.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), marksWait)
	defer cancel()
	if merr := r.cfg.Relay.WaitPublishIDs(wctx); merr != nil {
		r.log.Warn("marking the last events published failed; they are published again when their lease expires", slog.Any("error", merr))
	}
	return err
}

// watchPublication checks the publication every StatusInterval while the
// stream runs, and ends the session when it no longer publishes every insert
// into the outbox table whole (altered by hand: the stream would read
// nothing, or only some events, and look healthy while the rest waited for
// the safety net). Run then returns the reason, as Setup does at start. A
// publication dropped is left to the WAL sender's error (Run creates it
// again); a failed look is tried again at the next tick.
func (r *Relay) watchPublication(ctx context.Context, stop context.CancelCauseFunc) {
	t := time.NewTicker(r.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := checkPublication(ctx, r.cfg.Pool, r.cfg.Schema, r.cfg.Publication)
		if errors.Is(err, errForeignPublication) {
			r.log.Error("the stream's publication was altered and no longer publishes every insert into the outbox table; stopping the stream", slog.Any("error", err))
			stop(err)
			return
		}
		if err != nil && ctx.Err() == nil {
			r.log.Debug("checking the publication failed; trying again", slog.Any("error", err))
		}
	}
}

// errOwnSender: the slot is still held by the WAL sender of this relay's
// previous connection, which is exiting.
var errOwnSender = errors.New("outboxcdc: the previous connection's WAL sender still holds the slot")

// ownSenderWait is the first wait for this relay's own exiting WAL sender
// (doubling up to StandbyInterval).
const ownSenderWait = 5 * time.Millisecond

// errSlotActive: another process streams the slot.
type errSlotActive struct{ pid int }

func (e *errSlotActive) Error() string {
	return fmt.Sprintf("replication slot is active for PID %d", e.pid)
}

// marksWait bounds the wait for the last PublishIDs call's marks when the
// stream ends.
const marksWait = 10 * time.Second

// redact keeps a URL parse error from echoing the URL (and its password).
func redact(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("invalid connection string")
	}
	return err
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Run is New followed by Relay.Run.
func Run(ctx context.Context, cfg Config) error {
	r, err := New(cfg)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
