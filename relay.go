package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Defaults for RelayConfig.
const (
	BatchSizeDefault       = 1000
	LeaseDurationDefault   = 30 * time.Second
	PollIntervalDefault    = time.Second
	RetryBackoffMinDefault = time.Second
	RetryBackoffMaxDefault = 5 * time.Minute
	MaxAttemptsDefault     = 20
	ShutdownTimeoutDefault = 10 * time.Second
	// CatchUpIntervalDefault is RelayConfig.CatchUpInterval's default.
	CatchUpIntervalDefault = 5 * time.Millisecond
	// HeartbeatIntervalDefault is how often a relay records itself alive.
	HeartbeatIntervalDefault = 10 * time.Second
	// CleanupIntervalDefault is how often a relay's periodic clean-up runs.
	CleanupIntervalDefault = time.Minute
	// LoneOutageLimitDefault is RelayConfig.LoneOutageLimit's default.
	LoneOutageLimitDefault = 3
)

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Publisher sends claimed events to the destination. Required.
	Publisher Publisher
	// Schema is the PostgreSQL schema holding the outbox tables. Defaults to
	// "outbox".
	Schema string
	// ID names this relay in claimed_by. Defaults to host-pid-random.
	ID string
	// BatchSize is the most events claimed per round trip. Defaults to
	// BatchSizeDefault.
	BatchSize int
	// LeaseDuration is how long a claim stays the relay's own. Another relay
	// takes over events whose lease expired. Defaults to LeaseDurationDefault.
	LeaseDuration time.Duration
	// PollInterval is how long an idle relay waits before looking for events
	// again when no notification wakes it. Defaults to PollIntervalDefault.
	PollInterval time.Duration
	// RetryBackoffMin and RetryBackoffMax bound the exponential backoff (with
	// jitter) before a failed event is tried again. Default to
	// RetryBackoffMinDefault and RetryBackoffMaxDefault.
	RetryBackoffMin time.Duration
	RetryBackoffMax time.Duration
	// MaxAttempts is how many failed attempts quarantine an event. Defaults
	// to MaxAttemptsDefault.
	MaxAttempts int
	// ShutdownTimeout bounds how long Run waits, after its context ended,
	// for in-flight publishes before releasing what is left. Defaults to
	// ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration
	// CatchUpInterval is the shortest time between the starts of two claims
	// while the relay keeps up with the writers (its last claim was not a
	// full batch): under a steady stream of commits, each claim then takes
	// what a few milliseconds brought instead of the one or two events of
	// the last round trip, which costs the database far less per event. It
	// adds at most this much to commit-to-publish latency. A negative value
	// turns it off. Defaults to CatchUpIntervalDefault.
	CatchUpInterval time.Duration
	// DisableClaimAhead turns off claiming the next batch while one is
	// published (see the Relay documentation). Defaults to false.
	DisableClaimAhead bool
	// DisableNotify turns off LISTEN/NOTIFY wake-ups; the relay then only
	// polls. Defaults to false.
	DisableNotify bool
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer receives measurements of the relay's work, for metrics: any
	// value implementing one or more of ClaimObserver, PublishObserver,
	// SettleObserver and CleanupObserver (outboxprom.Metrics implements them
	// all). Optional.
	Observer any
	// HeartbeatInterval is how often the relay records itself alive in
	// outbox_relays; it counts as alive for three intervals after each
	// heartbeat ("outbox status", outbox_relays_alive). Defaults to
	// HeartbeatIntervalDefault.
	HeartbeatInterval time.Duration
	// Cleanup, when Cleanup.OlderThan is positive, makes the relay delete
	// settled events older than that (and inbox rows older than
	// Cleanup.InboxOlderThan, when set) every CleanupInterval, like
	// Admin.Cleanup. Several relays may all do it; their batches do not
	// collide. Off by default.
	Cleanup CleanupConfig
	// CleanupInterval is the pause between two periodic clean-ups. Defaults
	// to CleanupIntervalDefault.
	CleanupInterval time.Duration
	// LoneOutageLimit is how many consecutive claims an event may fail as
	// Unavailable while other events of its batch are published before the
	// relay stops believing the destination is down and counts the error
	// against the event: attempts are spent, and the event is quarantined
	// after MaxAttempts. It catches a destination that reports a
	// message-specific error as an outage. Defaults to
	// LoneOutageLimitDefault.
	LoneOutageLimit int
}

func (c RelayConfig) withDefaults() RelayConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
	if c.LoneOutageLimit == 0 {
		c.LoneOutageLimit = LoneOutageLimitDefault
	}
	def(&c.LeaseDuration, LeaseDurationDefault)
	def(&c.PollInterval, PollIntervalDefault)
	def(&c.RetryBackoffMin, RetryBackoffMinDefault)
	def(&c.RetryBackoffMax, RetryBackoffMaxDefault)
	def(&c.ShutdownTimeout, ShutdownTimeoutDefault)
	def(&c.CatchUpInterval, CatchUpIntervalDefault)
	def(&c.HeartbeatInterval, HeartbeatIntervalDefault)
	def(&c.CleanupInterval, CleanupIntervalDefault)
	if c.Cleanup.BatchSize == 0 {
		c.Cleanup.BatchSize = CleanupBatchSizeDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c RelayConfig) validate() error {
	switch {
	case c.Publisher == nil:
		return errors.New("outbox: RelayConfig.Publisher is required")
	case c.BatchSize < 1:
		return fmt.Errorf("outbox: BatchSize %d must be positive", c.BatchSize)
	case c.LeaseDuration < 100*time.Millisecond:
		return fmt.Errorf("outbox: LeaseDuration %s is under 100ms", c.LeaseDuration)
	case c.PollInterval < 0 || c.RetryBackoffMin < 0 || c.ShutdownTimeout < 0:
		return errors.New("outbox: durations must not be negative")
	case c.RetryBackoffMax < c.RetryBackoffMin:
		return fmt.Errorf("outbox: RetryBackoffMax %s is below RetryBackoffMin %s", c.RetryBackoffMax, c.RetryBackoffMin)
	case c.MaxAttempts < 1:
		return fmt.Errorf("outbox: MaxAttempts %d must be positive", c.MaxAttempts)
	case c.LoneOutageLimit < 1:
		return fmt.Errorf("outbox: LoneOutageLimit %d must be positive", c.LoneOutageLimit)
	case c.HeartbeatInterval < 10*time.Millisecond:
		return fmt.Errorf("outbox: HeartbeatInterval %s is under 10ms", c.HeartbeatInterval)
	case c.CleanupInterval < 0:
		return fmt.Errorf("outbox: CleanupInterval %s is negative", c.CleanupInterval)
	}
	if c.Cleanup.OlderThan != 0 || c.Cleanup.InboxOlderThan != 0 {
		if err := c.Cleanup.validate(); err != nil {
			return err
		}
	}
	return nil
}

// RelayStats are a relay's running totals.
type RelayStats struct {
	// Claimed counts events claimed (including re-claims after failures).
	Claimed int64
	// Published counts events acknowledged by the destination and marked.
	Published int64
	// Failed counts publish attempts that failed (retryable or not).
	Failed int64
	// Quarantined counts events this relay quarantined.
	Quarantined int64
	// LeaseConflicts counts write-backs refused because another relay had
	// taken the events over after this relay's lease expired.
	LeaseConflicts int64
	// TakenOver counts events this relay claimed from an expired lease.
	TakenOver int64
}

// Relay moves committed events from the outbox table to a destination,
// at least once and in order per aggregate.
//
// # Ordering
//
// A relay claims the head of each aggregate's lane (the lowest unpublished
// aggregate_sequence: its predecessor is published, an index probe on
// outbox_pending_lane_idx) and, in the same statement, the head's contiguous
// successors, and publishes a lane's events one after the other, each after
// the destination acknowledged the previous one. Because writers of one
// aggregate serialise on its counter row, event k+1 never becomes visible
// before k, so k+1 cannot be claimed without k, nor while k is pending,
// backed off, leased by another relay or quarantined. This holds
// across any number of relay processes without partition ownership, and a
// crashed relay's lanes move to the others as soon as its leases expire.
//
// # Claiming ahead
//
// While it publishes a full batch over many lanes, a relay already claims
// the next one, so the claim's round trip overlaps the broker's acks and the
// marks. The two batches hold disjoint lanes (the first one's events are
// leased, their successors are not heads), so order is unaffected. A batch
// claimed ahead and not published (shutdown, outage) is released.
type Relay struct {
	pool   *pgxpool.Pool
	cfg    RelayConfig
	schema pgident.Schema
	log    *slog.Logger
	sql    relaySQL
	wake   chan struct{}

	claimed, published, failed, quarantined, conflicts, takenOver atomic.Int64
	outages                                                       int // consecutive unavailable batches
	lone                                                          loneOutages

	obs     observers
	ahead   *ahead // the next batch, claimed while this one is published
	running atomic.Bool
	health  atomic.Pointer[error] // nil: the last batch went well
}

// NewRelay validates cfg and returns a relay over pool. Run starts it.
func NewRelay(pool *pgxpool.Pool, cfg RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: NewRelay needs a pool")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s, err := pgident.NewSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	obs, err := detectObservers(cfg.Observer)
	if err != nil {
		return nil, err
	}
	r := &Relay{
		pool:   pool,
		cfg:    cfg,
		schema: s,
		log:    cfg.Logger.With(slog.String("relay_id", cfg.ID)),
		sql:    newRelaySQL(s, cfg.BatchSize),
		wake:   make(chan struct{}, 1),
		obs:    obs,
	}
	r.setHealth(errNotStarted)
	return r, nil
}

// ID is the relay's claimed_by name.
func (r *Relay) ID() string { return r.cfg.ID }

// Stats returns the relay's running totals.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Claimed: r.claimed.Load(), Published: r.published.Load(), Failed: r.failed.Load(),
		Quarantined: r.quarantined.Load(), LeaseConflicts: r.conflicts.Load(), TakenOver: r.takenOver.Load(),
	}
}

// Wake makes an idle relay look for events now. It never blocks; wake-ups
// that arrive while the relay is busy collapse into one.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays events until ctx ends. Then it stops claiming, lets in-flight
// publishes finish (up to ShutdownTimeout), marks what was acknowledged,
// releases the rest and returns nil. It returns an error only for a problem
// that retrying cannot fix.
func (r *Relay) Run(ctx context.Context) error {
	if !r.cfg.DisableNotify {
		listenCtx, stopListen := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.listen(listenCtx) }()
		defer func() { stopListen(); <-done }()
	}
	defer r.startMaintenance(ctx)()
	defer r.dropAhead(ctx) // a batch claimed ahead and never published
	r.log.Info("relay started", slog.String("schema", r.schema.Name()), slog.Int("batch_size", r.cfg.BatchSize),
		slog.Duration("lease", r.cfg.LeaseDuration))
	dbBackoff := 0
	for ctx.Err() == nil {
		claimStart := time.Now()
		n, err := r.runBatch(ctx)
		r.noteBatch(err)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			dbBackoff++
			d := backoff(dbBackoff, 100*time.Millisecond, 10*time.Second)
			r.log.Warn("relay batch failed", slog.Any("error", err), slog.Duration("retry_in", d))
			sleep(ctx, d)
		case r.outages > 0:
			dbBackoff = 0
			d := backoff(r.outages, r.cfg.RetryBackoffMin, r.cfg.RetryBackoffMax)
			r.log.Warn("destination unavailable", slog.Int("consecutive", r.outages), slog.Duration("retry_in", d))
			r.waitIdle(ctx, d)
		case n == 0:
			dbBackoff = 0
			r.waitIdle(ctx, r.cfg.PollInterval)
		case n < r.cfg.BatchSize:
			dbBackoff = 0
			sleep(ctx, r.cfg.CatchUpInterval-time.Since(claimStart)) // caught up: let a few events gather
		default:
			dbBackoff = 0
		}
	}
	r.log.Info("relay stopped", slog.Int64("published", r.published.Load()))
	return nil
}

func (r *Relay) waitIdle(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-r.wake:
	}
}

// listen holds one connection with LISTEN on the schema's channel and turns
// notifications into wake-ups. On any error it reconnects after a pause; the
// relay keeps polling meanwhile.
func (r *Relay) listen(ctx context.Context) {
	channel := pgx.Identifier{NotifyChannel(r.schema.Name())}.Sanitize()
	failures := 0
	for ctx.Err() == nil {
		err := func() error {
			conn, err := r.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
				return err
			}
			defer func() {
				// The connection goes back to the pool: stop listening first.
				// If ctx was canceled mid-wait the connection is closed by pgx.
				if !conn.Conn().IsClosed() {
					_, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN "+channel)
				}
			}()
			failures = 0
			r.Wake() // catch anything committed before LISTEN took effect
			for {
				if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
					return err
				}
				r.Wake()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		failures++
		r.log.Warn("listen for notifications failed; polling meanwhile", slog.Any("error", err))
		sleep(ctx, backoff(failures, 100*time.Millisecond, 5*time.Second))
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// backoff returns an exponential delay for the n-th consecutive failure
// (n >= 1), capped at max, with "equal jitter": between half and all of it.
func backoff(n int, min, max time.Duration) time.Duration {
	d := min
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// claimedEvent is a claimed row.
type claimedEvent struct {
	Message
	attempts    int   // attempt_count before this attempt
	undecodable error // the row could not be read into a Message
}

// batch is one claim's events and its fencing token.
type batch struct {
	token    uuid.UUID
	deadline time.Time // local time after which the lease may be gone
	lanes    [][]claimedEvent
	total    int
	// takenOver counts events claimed from an expired lease.
	takenOver int
}

// runBatch claims, publishes and settles one batch. It returns how many
// events were claimed.
func (r *Relay) runBatch(ctx context.Context) (int, error) {
	b, claimDur, err := r.nextClaim(ctx)
	r.observeClaim(b, claimDur, err)
	if err != nil || b.total == 0 {
		return 0, err
	}
	if err := failpoint.Hit("relay/after-claim"); err != nil {
		return b.total, r.release(context.WithoutCancel(ctx), b, allIDs(b))
	}
	// Publishing goes on after ctx ends, for at most ShutdownTimeout, so a
	// shutdown does not throw away acknowledged work.
	workCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ShutdownTimeout, cancel)
		context.AfterFunc(workCtx, func() { t.Stop() })
	})
	defer stop()
	r.claimAhead(ctx, b)
	err = r.publishAndSettle(workCtx, b)
	if err != nil || r.outages > 0 || ctx.Err() != nil {
		r.dropAhead(ctx)
	}
	return b.total, err
}

func allIDs(b batch) []uuid.UUID {
	ids := make([]uuid.UUID, 0, b.total)
	for _, lane := range b.lanes {
		for _, ev := range lane {
			ids = append(ids, ev.ID)
		}
	}
	return ids
}

func (r *Relay) claim(ctx context.Context) (batch, error) {
	b := batch{token: uuid.New()}
	start := time.Now()
	// The claim is one autocommit statement (one round trip). Only when
	// failpoints are enabled does it run in an explicit transaction, so that
	// relay/during-claim sits between the UPDATE and the COMMIT.
	var q interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	} = r.pool
	var tx pgx.Tx
	if failpoint.Enabled() {
		var err error
		if tx, err = r.pool.Begin(ctx); err != nil {
			return b, fmt.Errorf("claim batch: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		q = tx
	}
	rows, err := q.Query(ctx, r.sql.claim, r.cfg.BatchSize, r.cfg.ID, b.token, r.cfg.LeaseDuration.Milliseconds())
	if err != nil {
		return b, fmt.Errorf("claim batch: %w", err)
	}
	var takenOver int64
	laneOf := map[[2]string]int{}
	for rows.Next() {
		var row messageRow
		var ev claimedEvent
		var prevOwner *string
		if err := rows.Scan(row.dest(&ev.attempts, &prevOwner)...); err != nil {
			rows.Close()
			return b, fmt.Errorf("claim batch: %w", err)
		}
		ev.Message, ev.undecodable = row.decode()
		ev.Attempt = ev.attempts + 1
		if prevOwner != nil {
			takenOver++
		}
		key := [2]string{ev.AggregateType, ev.AggregateID}
		i, ok := laneOf[key]
		if !ok {
			i = len(b.lanes)
			laneOf[key] = i
			b.lanes = append(b.lanes, nil)
		}
		b.lanes[i] = append(b.lanes[i], ev)
		b.total++
	}
	if err := rows.Err(); err != nil {
		return b, fmt.Errorf("claim batch: %w", err)
	}
	if tx != nil {
		if b.total > 0 {
			if err := failpoint.Hit("relay/during-claim"); err != nil {
				return batch{}, fmt.Errorf("claim batch: %w", err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return batch{}, fmt.Errorf("claim batch: %w", err)
		}
	}
	r.takenOver.Add(takenOver)
	b.takenOver = int(takenOver)
	if cut := orderLanes(b.lanes); len(cut) > 0 {
		r.log.Error("claim returned a lane with a gap; releasing the events after it", slog.Int("events", len(cut)))
		b.total -= len(cut)
		if err := r.release(ctx, b, cut); err != nil {
			return b, err
		}
	}
	if err := r.quarantineUndecodable(ctx, &b); err != nil {
		return b, err
	}
	// Leave a safety margin: stop publishing well before the lease could have
	// been taken over, since the database clock and ours may differ slightly.
	b.deadline = start.Add(r.cfg.LeaseDuration * 8 / 10)
	r.claimed.Add(int64(b.total))
	return b, nil
}

type failure struct {
	id         uuid.UUID
	prior      int  // the event's attempt_count before this attempt
	outage     bool // failed as Unavailable: no attempt spent
	delay      time.Duration
	attempts   int // attempts to add
	err        string
	quarantine bool
}

// publishAndSettle publishes a batch in waves (the i-th event of every lane
// in wave i, so an aggregate's events go out strictly one after the other),
// then records the outcome with fenced updates.
func (r *Relay) publishAndSettle(ctx context.Context, b batch) error {
	var published []uuid.UUID
	var failures []failure
	var unsent []uuid.UUID
	live := make([]int, len(b.lanes)) // lanes still going
	for i := range live {
		live[i] = i
	}
	outage := false
	for wave := 0; len(live) > 0; wave++ {
		if ctx.Err() != nil || time.Now().After(b.deadline) {
			break
		}
		msgs := make([]Message, len(live))
		for j, lane := range live {
			msgs[j] = b.lanes[lane][wave].Message
		}
		if err := failpoint.Hit("relay/before-publish"); err != nil {
			break
		}
		pubStart := time.Now()
		errs := r.cfg.Publisher.Publish(ctx, msgs)
		ackLatency, ackedAt := time.Since(pubStart), time.Now()
		if errs != nil && len(errs) != len(msgs) {
			return fmt.Errorf("publisher returned %d results for %d messages", len(errs), len(msgs))
		}
		cut := ctx.Err() != nil // shutdown timeout: failures are not the events' fault
		next := live[:0]
		for j, lane := range live {
			ev := b.lanes[lane][wave]
			if errs == nil || errs[j] == nil {
				r.observePublish(ev, nil, false, ackLatency, ackedAt)
				published = append(published, ev.ID)
				if wave+1 < len(b.lanes[lane]) {
					next = append(next, lane)
				}
				continue
			}
			if !cut {
				f := r.classify(ev, errs[j], &outage)
				r.observePublish(ev, errs[j], f.quarantine, ackLatency, time.Time{})
				failures = append(failures, f)
			}
		}
		live = next
		if err := failpoint.Hit("relay/after-ack-before-mark"); err != nil {
			return err
		}
	}
	// Whatever was not attempted goes back to the table untouched.
	for _, lane := range b.lanes {
		if len(published)+len(failures) == b.total {
			break // everything was attempted (the common case)
		}
		for _, ev := range lane {
			if !contains(published, ev.ID) && !containsFailure(failures, ev.ID) {
				unsent = append(unsent, ev.ID)
			}
		}
	}
	if outage && len(published) > 0 {
		outage = r.blameLoneOutages(failures)
	}
	for _, id := range published {
		r.forgetLoneOutage(id)
	}
	if outage {
		r.outages++
	} else if len(published) > 0 {
		r.outages = 0
	}
	settleCtx := context.WithoutCancel(ctx)
	if len(failures) == 0 && len(unsent) == 0 {
		if len(published) == 0 {
			return nil
		}
		return r.markPublished(settleCtx, b, published) // the common case
	}
	return r.settleAll(settleCtx, b, published, failures, unsent)
}

func contains(ids []uuid.UUID, id uuid.UUID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func containsFailure(fs []failure, id uuid.UUID) bool {
	for _, f := range fs {
		if f.id == id {
			return true
		}
	}
	return false
}

func (r *Relay) classify(ev claimedEvent, err error, outage *bool) failure {
	r.failed.Add(1)
	f := failure{id: ev.ID, prior: ev.attempts, err: truncate(err.Error(), 2000)}
	switch {
	case IsUnavailable(err):
		// The destination is down: no attempt is spent on this event.
		*outage, f.outage = true, true
		f.delay = backoff(r.outages+1, r.cfg.RetryBackoffMin, r.cfg.RetryBackoffMax)
	case IsPermanent(err):
		f.attempts, f.quarantine = 1, true
	default:
		f.attempts = 1
		if ev.attempts+1 >= r.cfg.MaxAttempts {
			f.quarantine = true
		} else {
			f.delay = backoff(ev.attempts+1, r.cfg.RetryBackoffMin, r.cfg.RetryBackoffMax)
		}
	}
	if f.quarantine {
		r.quarantined.Add(1)
		r.log.Error("event quarantined", slog.String("event_id", ev.ID.String()), slog.String("aggregate_type", ev.AggregateType),
			slog.String("aggregate_id", ev.AggregateID), slog.Int64("sequence", ev.Sequence), slog.Any("error", err))
	}
	return f
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func (r *Relay) markPublished(ctx context.Context, b batch, ids []uuid.UUID) error {
	start := time.Now()
	tag, err := r.pool.Exec(ctx, r.sql.markPublished, uuidArgs(ids), b.token)
	r.observeSettle(SettleMarkPublished, len(ids), tag.RowsAffected(), start, err)
	if err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	r.published.Add(tag.RowsAffected())
	r.noteConflicts("mark published", len(ids), tag.RowsAffected())
	return nil
}

func (r *Relay) markFailed(ctx context.Context, b batch, fs []failure) error {
	ids := make([]uuid.UUID, len(fs))
	delays := make([]int64, len(fs))
	attempts := make([]int32, len(fs))
	msgs := make([]string, len(fs))
	quarantine := make([]bool, len(fs))
	for i, f := range fs {
		ids[i], delays[i], attempts[i], msgs[i], quarantine[i] = f.id, f.delay.Milliseconds(), int32(f.attempts), f.err, f.quarantine
	}
	start := time.Now()
	tag, err := r.pool.Exec(ctx, r.sql.markFailed, uuidArgs(ids), delays, attempts, msgs, quarantine, b.token)
	r.observeSettle(SettleRecordFailures, len(ids), tag.RowsAffected(), start, err)
	if err != nil {
		return fmt.Errorf("record failures: %w", err)
	}
	r.noteConflicts("record failures", len(ids), tag.RowsAffected())
	return nil
}

func (r *Relay) release(ctx context.Context, b batch, ids []uuid.UUID) error {
	start := time.Now()
	tag, err := r.pool.Exec(ctx, r.sql.release, uuidArgs(ids), b.token)
	r.observeSettle(SettleRelease, len(ids), tag.RowsAffected(), start, err)
	if err != nil {
		return fmt.Errorf("release claims: %w", err)
	}
	r.noteConflicts("release", len(ids), tag.RowsAffected())
	return nil
}

func (r *Relay) noteConflicts(op string, want int, got int64) {
	if lost := int64(want) - got; lost > 0 {
		r.conflicts.Add(lost)
		r.log.Warn("lease lost: another relay took these events over", slog.String("op", op), slog.Int64("events", lost))
	}
}
