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
	BatchSizeDefault       = 500
	LeaseDurationDefault   = 30 * time.Second
	PollIntervalDefault    = time.Second
	RetryBackoffMinDefault = time.Second
	RetryBackoffMaxDefault = 5 * time.Minute
	MaxAttemptsDefault     = 20
	ShutdownTimeoutDefault = 10 * time.Second
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
	// DisableNotify turns off LISTEN/NOTIFY wake-ups; the relay then only
	// polls. Defaults to false.
	DisableNotify bool
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
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
	def(&c.LeaseDuration, LeaseDurationDefault)
	def(&c.PollInterval, PollIntervalDefault)
	def(&c.RetryBackoffMin, RetryBackoffMinDefault)
	def(&c.RetryBackoffMax, RetryBackoffMaxDefault)
	def(&c.ShutdownTimeout, ShutdownTimeoutDefault)
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
// A relay claims only the head of each aggregate's lane: the lowest
// unpublished aggregate_sequence, and only when no earlier event of that
// aggregate is unpublished (an index probe on outbox_pending_lane_idx).
// Because writers of one aggregate serialise on its counter row, event k+1
// never becomes visible before k, so k+1 cannot be claimed while k is
// pending, backed off, leased by another relay or quarantined. This holds
// across any number of relay processes without partition ownership, and a
// crashed relay's lanes move to the others as soon as its leases expire.
type Relay struct {
	pool   *pgxpool.Pool
	cfg    RelayConfig
	schema pgident.Schema
	log    *slog.Logger
	sql    relaySQL
	wake   chan struct{}

	claimed, published, failed, quarantined, conflicts, takenOver atomic.Int64
	outages                                                       int // consecutive unavailable batches
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
	return &Relay{
		pool:   pool,
		cfg:    cfg,
		schema: s,
		log:    cfg.Logger.With(slog.String("relay_id", cfg.ID)),
		sql:    newRelaySQL(s),
		wake:   make(chan struct{}, 1),
	}, nil
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
	r.log.Info("relay started", slog.String("schema", r.schema.Name()), slog.Int("batch_size", r.cfg.BatchSize),
		slog.Duration("lease", r.cfg.LeaseDuration))
	dbBackoff := 0
	for ctx.Err() == nil {
		n, err := r.runBatch(ctx)
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
	attempts int // attempt_count before this attempt
}

// batch is one claim's events and its fencing token.
type batch struct {
	token    uuid.UUID
	deadline time.Time // local time after which the lease may be gone
	lanes    [][]claimedEvent
	total    int
}

// runBatch claims, publishes and settles one batch. It returns how many
// events were claimed.
func (r *Relay) runBatch(ctx context.Context) (int, error) {
	b, err := r.claim(ctx)
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
	return b.total, r.publishAndSettle(workCtx, b)
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
	rows, err := r.pool.Query(ctx, r.sql.claim, r.cfg.BatchSize, r.cfg.ID, b.token, r.cfg.LeaseDuration.Milliseconds())
	if err != nil {
		return b, fmt.Errorf("claim batch: %w", err)
	}
	laneOf := map[[2]string]int{}
	for rows.Next() {
		var ev claimedEvent
		var prevOwner *string
		if err := rows.Scan(&ev.ID, &ev.AggregateType, &ev.AggregateID, &ev.Sequence, &ev.Type, &ev.SchemaVersion,
			&ev.Payload, &ev.Headers, &ev.OccurredAt, &ev.attempts, &prevOwner); err != nil {
			rows.Close()
			return b, fmt.Errorf("claim batch: %w", err)
		}
		ev.Attempt = ev.attempts + 1
		ev.OccurredAt = ev.OccurredAt.UTC()
		if prevOwner != nil {
			r.takenOver.Add(1)
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
	// Leave a safety margin: stop publishing well before the lease could have
	// been taken over, since the database clock and ours may differ slightly.
	b.deadline = start.Add(r.cfg.LeaseDuration * 8 / 10)
	r.claimed.Add(int64(b.total))
	return b, nil
}

type failure struct {
	id         uuid.UUID
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
		errs := r.cfg.Publisher.Publish(ctx, msgs)
		if errs != nil && len(errs) != len(msgs) {
			return fmt.Errorf("publisher returned %d results for %d messages", len(errs), len(msgs))
		}
		cut := ctx.Err() != nil // shutdown timeout: failures are not the events' fault
		next := live[:0]
		for j, lane := range live {
			ev := b.lanes[lane][wave]
			if errs == nil || errs[j] == nil {
				published = append(published, ev.ID)
				if wave+1 < len(b.lanes[lane]) {
					next = append(next, lane)
				}
				continue
			}
			if !cut {
				failures = append(failures, r.classify(ev, errs[j], &outage))
			}
		}
		live = next
		if err := failpoint.Hit("relay/after-ack-before-mark"); err != nil {
			return err
		}
	}
	// Whatever was not attempted goes back to the table untouched.
	for _, lane := range b.lanes {
		for _, ev := range lane {
			if !contains(published, ev.ID) && !containsFailure(failures, ev.ID) {
				unsent = append(unsent, ev.ID)
			}
		}
	}
	if outage {
		r.outages++
	} else if len(published) > 0 {
		r.outages = 0
	}
	settleCtx := context.WithoutCancel(ctx)
	var errs []error
	if len(published) > 0 {
		errs = append(errs, r.markPublished(settleCtx, b, published))
	}
	if len(failures) > 0 {
		errs = append(errs, r.markFailed(settleCtx, b, failures))
	}
	if len(unsent) > 0 {
		errs = append(errs, r.release(settleCtx, b, unsent))
	}
	return errors.Join(errs...)
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
	f := failure{id: ev.ID, err: truncate(err.Error(), 2000)}
	switch {
	case IsUnavailable(err):
		// The destination is down: no attempt is spent on this event.
		*outage = true
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
	tag, err := r.pool.Exec(ctx, r.sql.markPublished, ids, b.token)
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
	tag, err := r.pool.Exec(ctx, r.sql.markFailed, ids, delays, attempts, msgs, quarantine, b.token)
	if err != nil {
		return fmt.Errorf("record failures: %w", err)
	}
	r.noteConflicts("record failures", len(ids), tag.RowsAffected())
	return nil
}

func (r *Relay) release(ctx context.Context, b batch, ids []uuid.UUID) error {
	tag, err := r.pool.Exec(ctx, r.sql.release, ids, b.token)
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
