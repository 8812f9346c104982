package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	backoffpkg "github.com/pgoutbox/outbox/internal/backoff"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgoutbox/outbox/internal/failpoint"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgretry"
	"go.opentelemetry.io/otel/trace"
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
	// PartitionsAheadDefault is how many partitions a relay keeps ready
	// after the current one on a partitioned outbox.
	PartitionsAheadDefault = 6
	// LaneSweepIntervalDefault is how often a relay's lane sweep runs.
	LaneSweepIntervalDefault = time.Minute
	// VacuumIntervalDefault is how often a relay vacuums the outbox tables
	// where autovacuum is off.
	VacuumIntervalDefault = time.Minute
	// LoneOutageLimitDefault is RelayConfig.LoneOutageLimit's default.
	LoneOutageLimitDefault = 3
	// OutageProbeMaxDefault is RelayConfig.OutageProbeMax's default.
	OutageProbeMaxDefault = time.Second
)

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Publisher sends claimed events to the destination. Required.
	Publisher Publisher
	// Schema is the PostgreSQL schema holding the outbox tables, as a plain
	// string: the older field, kept working; prefer Tables. Defaults to
	// "outbox".
	Schema string
	// Tables is the schema holding the outbox tables: the one Schema value an
	// application gives every component's config (see outbox.Schema). Setting
	// it and Schema to different names is refused (ErrSchemaConflict).
	// Defaults to Schema, then "outbox".
	Tables Schema
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
	// jitter) before a failed event is tried again, and before the events of
	// a route the destination refuses are tried again (the route is probed
	// meanwhile, see OutageProbeMax). Default to RetryBackoffMinDefault and
	// RetryBackoffMaxDefault. They never apply to an outage of the whole
	// destination, which is the destination's state, not the events'.
	RetryBackoffMin time.Duration
	RetryBackoffMax time.Duration
	// OutageProbeMax is the longest wait between two looks at a destination
	// that is unavailable (a Probe, or, for a Publisher that is no Prober, a
	// batch): the waits grow from an eighth of it to it, and wake-up
	// notifications do not cut them short. The events that met the outage
	// are released untouched (no attempt spent, available_at unchanged) and
	// go out as soon as a look finds the destination back, so an outage
	// delays them by at most this much past its end. It is also the longest
	// wait between two probes of a route the destination refuses (see
	// RouteUnavailable). Defaults to OutageProbeMaxDefault.
	OutageProbeMax time.Duration
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
	// DisablePipelining makes the relay publish in waves (one event of
	// each aggregate per Publish call, k+1 only after k was acknowledged)
	// even to a Publisher that declares ordered pipelining (see
	// OrderedPipeliner). Defaults to false.
	DisablePipelining bool
	// DisableNotify turns off LISTEN/NOTIFY wake-ups; the relay then only
	// polls. Defaults to false.
	DisableNotify bool
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer receives measurements of the relay's work, for metrics: any
	// value implementing one or more of ClaimObserver, PublishObserver,
	// SettleObserver, CleanupObserver and DurabilityObserver
	// (outboxprom.Metrics implements them all). Optional.
	Observer any
	// HeartbeatInterval is how often the relay records itself alive in
	// outbox_relays; it counts as alive for three intervals after each
	// heartbeat ("outbox status", outbox_relays_alive). Defaults to
	// HeartbeatIntervalDefault; at most RelayHeartbeatLifetimeMax / 3 (20
	// minutes).
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
	// PartitionsAhead: on a partitioned outbox_events
	// (outboxmigrate.Partition), the relay's upkeep keeps this many
	// partitions ready after the current one, and, when Cleanup.OlderThan is
	// set, drops each partition whose events are all settled and published
	// longer ago than that, instead of deleting rows (docs/operations.md,
	// "Partitioned outbox"). The upkeep needs the role that owns the table.
	// Defaults to PartitionsAheadDefault.
	PartitionsAhead int
	// LoneOutageLimit is how many consecutive claims an event may fail as
	// Unavailable while other events of its batch are published before the
	// relay stops believing the destination is down and counts the error
	// against the event: attempts are spent, and the event is quarantined
	// after MaxAttempts. It catches a destination that reports a
	// message-specific error as an outage. Defaults to
	// LoneOutageLimitDefault.
	LoneOutageLimit int
	// LaneSweepInterval is the pause between two runs of the lane sweep,
	// which parks the events waiting behind a quarantined event that were
	// not parked when written (writers that do not read the lane's parked
	// flag, lanes blocked before migration 006) and unparks lanes whose
	// quarantine was lifted by hand. It also runs when the relay starts.
	// Defaults to LaneSweepIntervalDefault.
	LaneSweepInterval time.Duration
	// VacuumInterval: where autovacuum is off for outbox_events (the
	// server's autovacuum setting, or the table's autovacuum_enabled), the
	// relay runs VACUUM (ANALYZE) on outbox_events and outbox_aggregates
	// itself this often, one relay of the schema at a time. Without any
	// vacuum every claim walks the index entries of all the events published
	// since, and a relay at 1,000 events/s falls behind within minutes
	// (BENCHMARKS.md, soak). Where autovacuum is on it does nothing. Defaults
	// to VacuumIntervalDefault; negative turns it off.
	VacuumInterval time.Duration
	// ReconcileAfter, when positive, makes the relay a safety net beside a
	// change-data-capture relay (package outboxcdc): it claims only lanes
	// whose head was written at least this long ago (occurred_at; a head
	// backing off after a failure is claimed once its backoff ends, as
	// always), leaving younger events to the CDC path. Leases and fencing
	// are the same, so the two never publish an aggregate out of order.
	// Such a relay does not LISTEN (a wake-up is for an event just written,
	// which it leaves): when idle it looks every PollInterval or every
	// ReconcileAfter/4, whichever is longer, runs its full scans at most
	// every 6 × ReconcileAfter (or RescanInterval, if longer), and never
	// locks a row younger than ReconcileAfter, even for the claim's
	// statement, so that it does not get in the stream's way.
	// Zero (the default) claims every due event: ordinary polling.
	ReconcileAfter time.Duration
	// RescanInterval is how often the relay claims with a full scan of the
	// pending events instead of reading only what is new since its last
	// claim (see docs/design.md, "Claiming only what is new"). The full scan
	// finds what the incremental claim does not look for: events leased by a
	// relay that died, once their lease expires, and rows without a
	// dispatch_xid (written before migration 009). After the relay's first,
	// a full scan reads from a low-water mark (the oldest pending event, at
	// most two intervals before now) and, every sixty intervals, from the
	// start (docs/design.md, "Cost"). A full scan that fills its
	// batch is followed by another one at once. A negative value makes every
	// claim a full scan, as before the incremental claim existed. A safety
	// net (ReconcileAfter) scans at most every 6 × ReconcileAfter. Defaults
	// to RescanIntervalDefault (5s).
	RescanInterval time.Duration
	// IdleBackoffMax, when positive, makes an idle relay cheap: while its
	// claims find nothing, its poll (PollInterval) waits as long as the
	// relay has been idle (the waits double), and its periodic upkeep
	// (HeartbeatInterval, LaneSweepInterval, VacuumInterval, CleanupInterval)
	// four times as long, each at least its interval and at most
	// IdleBackoffMax; the vacuum is skipped while the relay claimed nothing
	// since the last one, and the health in the heartbeat row is rewritten
	// only when it changed. The first claim that finds an event brings them
	// all back to their intervals. A wake-up (LISTEN/NOTIFY, Wake) still ends a poll's wait at
	// once, so with notifications on, writers that notify see no added
	// latency; an event written without a notification waits up to
	// IdleBackoffMax. The heartbeat's lifetime follows its wait (three
	// waits), so an idle relay stays alive in "outbox status" and a relay
	// that died while idle is shown alive for up to 3 × IdleBackoffMax.
	// At most RelayHeartbeatLifetimeMax / 3 (20 minutes), as is
	// HeartbeatInterval. Package outboxfleet sets it for the many sources of one process.
	// Zero (the default) turns it off.
	IdleBackoffMax time.Duration

	// TracerProvider receives a PRODUCER span per event published (see
	// docs/operations.md, "Tracing"): a child of the trace context the
	// writer stored with the event, whose own context replaces the
	// message's traceparent so that the consumer continues from the
	// publish. Nil means otel.GetTracerProvider() (read, never set), a no-op
	// unless the application configured one; the relay then costs next to
	// nothing per event. Defaults to nil.
	TracerProvider trace.TracerProvider
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
	def(&c.OutageProbeMax, OutageProbeMaxDefault)
	def(&c.ShutdownTimeout, ShutdownTimeoutDefault)
	def(&c.CatchUpInterval, CatchUpIntervalDefault)
	def(&c.HeartbeatInterval, HeartbeatIntervalDefault)
	def(&c.CleanupInterval, CleanupIntervalDefault)
	if c.PartitionsAhead == 0 {
		c.PartitionsAhead = PartitionsAheadDefault
	}
	def(&c.LaneSweepInterval, LaneSweepIntervalDefault)
	def(&c.VacuumInterval, VacuumIntervalDefault)
	def(&c.RescanInterval, RescanIntervalDefault)
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
	case c.OutageProbeMax < 8*time.Millisecond:
		return fmt.Errorf("outbox: OutageProbeMax %s is under 8ms", c.OutageProbeMax)
	case c.LoneOutageLimit < 1:
		return fmt.Errorf("outbox: LoneOutageLimit %d must be positive", c.LoneOutageLimit)
	case c.HeartbeatInterval < 10*time.Millisecond:
		return fmt.Errorf("outbox: HeartbeatInterval %s is under 10ms", c.HeartbeatInterval)
	case c.HeartbeatInterval > RelayHeartbeatLifetimeMax/3:
		return fmt.Errorf("outbox: HeartbeatInterval %s is over %s (a heartbeat row lives three intervals, and status believes one for %s at most)",
			c.HeartbeatInterval, RelayHeartbeatLifetimeMax/3, RelayHeartbeatLifetimeMax)
	case c.PartitionsAhead < 0:
		return fmt.Errorf("outbox: PartitionsAhead %d is negative", c.PartitionsAhead)
	case c.CleanupInterval < 0:
		return fmt.Errorf("outbox: CleanupInterval %s is negative", c.CleanupInterval)
	case c.ReconcileAfter < 0:
		return fmt.Errorf("outbox: ReconcileAfter %s is negative", c.ReconcileAfter)
	case c.LaneSweepInterval < 0:
		return fmt.Errorf("outbox: LaneSweepInterval %s is negative", c.LaneSweepInterval)
	case c.IdleBackoffMax < 0:
		return fmt.Errorf("outbox: IdleBackoffMax %s is negative", c.IdleBackoffMax)
	case c.IdleBackoffMax > RelayHeartbeatLifetimeMax/3:
		return fmt.Errorf("outbox: IdleBackoffMax %s is over %s (an idle relay's heartbeat row lives three waits, and status believes one for %s at most)",
			c.IdleBackoffMax, RelayHeartbeatLifetimeMax/3, RelayHeartbeatLifetimeMax)
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
	// Outages counts the looks at the destination (a batch in which nothing
	// was published and some event failed as Unavailable, or a failed
	// Probe) that found it unavailable as a whole.
	Outages int64
	// Held counts the failures of events held back because the destination
	// refused their route (see RouteUnavailable): no attempt spent.
	Held int64
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
	sweep  chan struct{} // runs the lane sweep now (a settle parked part of a long lane)

	claimed, published, failed, quarantined, conflicts, takenOver atomic.Int64
	outageLooks, held                                             atomic.Int64

	// The loop's own state (Run's goroutine, or the PublishIDs caller's):
	outages   int    // consecutive looks that found the destination unavailable; 0: no outage
	outageErr string // the last of those looks' error
	// dbFailingSince is when the current run of batches failing on the
	// database began (zero: the last batch reached it); see noteBatch.
	dbFailingSince time.Time
	lone           loneOutages
	routes         routeHolds

	obs    observers
	prober Prober // cfg.Publisher, when it implements Prober
	// ack: what the destination's acknowledgement is worth (relay_durability.go).
	ack ackState
	// pipelined: cfg.Publisher declares ordered pipelining (and
	// DisablePipelining is not set): a batch goes out in one call.
	pipelined bool
	ahead     *ahead         // the next batch, claimed while this one is published
	full      fullScan       // the full scan in the background (relay_fullscan.go)
	cursor    claimCursor    // where the next incremental claim starts
	tracer    *publishTracer // nil: tracing off (a no-op provider)
	running   atomic.Bool
	idle      idleClock             // since when the claims find nothing (relay_idle.go)
	health    atomic.Pointer[error] // nil: the last batch went well
	idsMu     sync.Mutex            // one PublishIDs call at a time
	idsMarks  *idsMarks             // the last PublishIDs call's marks, written in the background
	// partitionOnce makes the statements a partitioned outbox's, once
	// (partitionAware).
	partitionOnce sync.Once
	// partitioned: partitionAware found outbox_events partitioned; its
	// statements then run with partitionPlanSQL (relay_partition_plan.go).
	partitioned bool
	// testHookMarks, set by tests before the relay is used, runs before
	// background marks are written.
	testHookMarks func()
	// testPartitionEvery, set by tests before Run, replaces
	// partitionUpkeepEvery.
	testPartitionEvery time.Duration
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
	s, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: %w", err)
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
		sweep:  make(chan struct{}, 1),
		obs:    obs,
	}
	if cfg.ReconcileAfter > 0 {
		// The safety net beside a CDC relay claims only heads written
		// ReconcileAfter ago, and its cursor never passes the young events
		// it leaves: they may be the ones the stream misses.
		r.sql.claim = claimSQL(s.Table("outbox_events"), cfg.BatchSize, reconcileHeadSQL("e", cfg.ReconcileAfter))
		r.sql.look = lookSQL(s.Table("outbox_events"), cfg.BatchSize, reconcileHeadSQL("e", cfg.ReconcileAfter))
		r.sql.claimLooked = claimLookedSQL(s.Table("outbox_events"), cfg.BatchSize, reconcileHeadSQL("e", cfg.ReconcileAfter))
		r.sql.fastClaim = fastClaimSQL(s.Table("outbox_events"), cfg.BatchSize, reconcileHeadSQL("f", cfg.ReconcileAfter), true)
		r.cursor.conservative = true
	}
	r.prober, _ = cfg.Publisher.(Prober)
	if op, ok := cfg.Publisher.(OrderedPipeliner); ok && !cfg.DisablePipelining {
		r.pipelined = op.OrderedPipelining()
	}
	r.tracer = newPublishTracer(cfg.TracerProvider, cfg.Publisher)
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
		Outages: r.outageLooks.Load(), Held: r.held.Load(),
	}
}

// Run relays events until ctx ends. Then it stops claiming, lets in-flight
// publishes finish (up to ShutdownTimeout), marks what was acknowledged,
// releases the rest and returns nil. It returns an error only for a problem
// that retrying cannot fix.
func (r *Relay) Run(ctx context.Context) error {
	r.partitionAware(ctx)
	if !r.cfg.DisableNotify && r.cfg.ReconcileAfter <= 0 {
		// A safety net (ReconcileAfter) does not listen: every wake-up is
		// for an event just written, which it leaves to the CDC stream.
		listenCtx, stopListen := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.listen(listenCtx) }()
		defer func() { stopListen(); <-done }()
	}
	defer r.startMaintenance(ctx)()
	// Registered after startMaintenance: it stops before the heartbeat row goes.
	defer r.startAckDurabilityCheck(ctx)()
	defer r.dropAhead(ctx) // a batch claimed ahead and never published
	r.runFullScans(ctx)
	defer r.dropFullScan(ctx) // a full scan's batch never taken
	r.log.Info("relay started", slog.String("schema", r.schema.Name()), slog.Int("batch_size", r.cfg.BatchSize),
		slog.Duration("lease", r.cfg.LeaseDuration))
	lostConnRetries := int(r.pool.Config().MaxConns) + 1
	dbBackoff, quickLeft := 0, lostConnRetries
	for ctx.Err() == nil {
		claimStart := time.Now()
		r.probeRoutes(ctx)
		// In an outage the destination is looked at before anything is
		// claimed: with a Prober, a probe; without one, the batch itself.
		if r.outages > 0 && !r.probeOutage(ctx) {
			r.noteBatch(nil)
			r.waitOutage(ctx)
			continue
		}
		probed := r.outages > 0 && r.prober != nil
		n, more, err := r.runBatch(ctx)
		if err == nil && n == 0 && probed {
			r.endOutage("the probe succeeded and nothing is left to publish")
		}
		r.noteBatch(err)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			var d time.Duration
			if quickLeft > 0 && connDied(err) {
				// A connection the pool held died while idle (a pooler's
				// restart, idle_session_timeout, pg_terminate_backend):
				// the pool dropped it, and the next is likely fine, or
				// dead too (they died together; pgxpool pings only those
				// idle for over a second). Try again almost at once, once
				// per connection the pool may hold, before backing off as
				// for any other failure; a server that refuses new
				// connections backs off at once.
				quickLeft--
				d = lostConnRetry
			} else {
				dbBackoff++
				d = backoff(dbBackoff, 100*time.Millisecond, 10*time.Second)
			}
			r.log.Warn("relay batch failed", slog.Any("error", err), slog.Duration("retry_in", d))
			sleep(ctx, d)
		case r.outages > 0:
			dbBackoff, quickLeft = 0, lostConnRetries
			r.waitOutage(ctx)
		case more:
			// The cursor crossed a full window it could claim nothing (or
			// little) from: what lies past it is committed and unread.
			// Waiting PollInterval for each window, a block of a lane's
			// events behind a head backing off held everything past it for
			// minutes (TestLivenessAdv37OneRelayCrossesABlockAtPollPace),
			// a lane set aside there too, which the probe of its next event
			// used to claim at once (TestLivenessAdv37SetAsideBehindALaggingCursor).
			dbBackoff, quickLeft = 0, lostConnRetries
		case n == 0:
			dbBackoff, quickLeft = 0, lostConnRetries
			r.waitIdle(ctx, r.routesUntilProbe(r.idleStretch(r.idleInterval())))
		case n < r.cfg.BatchSize:
			dbBackoff, quickLeft = 0, lostConnRetries
			sleep(ctx, r.cfg.CatchUpInterval-time.Since(claimStart)) // caught up: let a few events gather
		default:
			dbBackoff, quickLeft = 0, lostConnRetries
		}
	}
	r.handOffLanes(ctx)
	r.log.Info("relay stopped", slog.Int64("published", r.published.Load()))
	return nil
}

// runBatch claims, publishes and settles one batch. It returns how many
// events were claimed, and whether the claim has more to read at once
// (batch.more).
func (r *Relay) runBatch(ctx context.Context) (int, bool, error) {
	// The claim, and then publishing, go on after ctx ends, for at most
	// ShutdownTimeout, so a shutdown does not throw away acknowledged work,
	// nor leave a claim's rows leased: a claim cancelled while its
	// statement was in flight may still commit (the cancel request travels
	// on a connection of its own), and its rows stayed leased to the
	// stopped relay for the whole lease, behind every other relay's cursor
	// (TestLivenessAdv34StopDuringAClaimLeavesItsRowsLeased). A claim that
	// completes is published or released like any other batch.
	workCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ShutdownTimeout, cancel)
		context.AfterFunc(workCtx, func() { t.Stop() })
	})
	defer stop()
	b, claimDur, full, err := r.nextClaim(workCtx)
	r.observeClaim(b, claimDur, err, full)
	if err == nil {
		r.idle.noteClaim(b.total, time.Now())
	}
	if err != nil || b.total == 0 {
		return 0, b.more, err
	}
	if err := failpoint.Hit("relay/after-claim"); err != nil {
		return b.total, false, r.release(context.WithoutCancel(ctx), b, allIDs(b))
	}
	r.claimAhead(ctx, b)
	err = r.publishAndSettle(workCtx, b)
	if err != nil || r.outages > 0 || ctx.Err() != nil {
		r.dropAhead(ctx)
	}
	return b.total, b.more, err
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// lostConnRetry is how long the relay waits after a round that lost an
// established connection, up to once per connection of its pool in a row
// (a pool of dead idle connections), before it backs off.
const lostConnRetry = 10 * time.Millisecond

// connDied reports whether err is an established connection's death (the
// server ended the session, the socket closed), not a refused connection
// attempt: another connection of the pool may well work.
func connDied(err error) bool {
	var connErr *pgconn.ConnectError
	return pgretry.ConnectionLost(err) && !errors.As(err, &connErr)
}

// backoff returns an exponential delay for the n-th consecutive failure
// (n >= 1), capped at max, with "equal jitter": between half and all of it.
func backoff(n int, min, max time.Duration) time.Duration { return backoffpkg.Jittered(n, min, max) }
