package sideeffect

import (
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/backoff"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Mode says what the provider offers to make a retried call safe. It decides
// what Do does with an attempt whose outcome is unknown.
type Mode int

const (
	// Idempotent: the provider honours idempotency keys: a call repeated
	// with the same key takes effect at most once and returns the first
	// call's response. Retrying an unknown attempt is safe; with a Lookup
	// configured, Do and the reconciler still ask first.
	Idempotent Mode = iota + 1
	// Queryable: the provider ignores keys, but can say what happened to a
	// key (the key travels with the call, e.g. as a reference field, and the
	// provider can be queried by it). Config.Lookup is required: an unknown
	// attempt is looked up and called again only when the provider has no
	// record of it.
	Queryable
	// Neither: no idempotency keys and no lookup. An unknown attempt can
	// only be parked for an operator or, with Config.BlindRetry, called
	// again at the risk of a duplicate effect; such calls are counted as
	// blind retries.
	Neither
)

func (m Mode) String() string {
	switch m {
	case Idempotent:
		return "idempotent"
	case Queryable:
		return "queryable"
	case Neither:
		return "neither"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// State is the state of an attempt, as stored in side_effects.state.
type State string

const (
	// Started: the attempt is claimed; a call or a lookup may be under way.
	// Past its lease, it is treated as Unknown (the call may have happened).
	Started State = "started"
	// Succeeded: the provider accepted the call; the response is recorded.
	Succeeded State = "succeeded"
	// Failed: the provider refused the call for good (a declined card); the
	// response is recorded. It is never called again.
	Failed State = "failed"
	// Unknown: a call may or may not have taken effect.
	Unknown State = "unknown"
	// Parked: an unknown attempt that could not be resolved within the
	// bound, or in mode Neither without BlindRetry; an operator decides.
	Parked State = "parked"
)

// Errors returned by Do and the Admin. They are wrapped with the name and key.
var (
	// ErrUnknown: the attempt's outcome is unknown (the call timed out, its
	// response was lost, the provider failed after receiving it, or a lookup
	// failed). Do has recorded it; call Do again later (e.g. let the broker
	// redeliver the event): it is resolved with the same key, never a new one.
	ErrUnknown = errors.New("the outcome of the call is unknown")
	// ErrInProgress: another caller holds the attempt (its lease is live):
	// it may be calling right now. Try again later.
	ErrInProgress = errors.New("another caller is handling this attempt")
	// ErrParked: the attempt is parked for an operator (see Admin.Resolve);
	// Do does not call until it is resolved.
	ErrParked = errors.New("the attempt is parked for an operator")
	// ErrFingerprintMismatch: the key was used before with another request.
	// A programming error: the key must identify one request.
	ErrFingerprintMismatch = errors.New("the key was used before with a different request")
	// ErrLeaseLost: the caller's claim expired during the call and another
	// caller took the attempt over; this call's outcome was not recorded.
	// Make Config.Lease longer than Config.CallTimeout allows for.
	ErrLeaseLost = errors.New("the claim on the attempt expired during the call")
	// ErrLeaseExpired: the caller was paused between its claim and its call
	// (a GC pause, SIGSTOP, a frozen VM) until its lease had ended, or had
	// too little left for the call to end within it, so Do did not call:
	// past the lease another caller may own the attempt and be calling.
	// Nothing was called and nothing recorded as an outcome; the claim was
	// given back (unless another caller had taken it). Treat it like
	// ErrInProgress: call Do again later, e.g. on the event's redelivery.
	ErrLeaseExpired = errors.New("the claim on the attempt ran out before the call: nothing was called")
	// ErrNotFound: no attempt with that name and key.
	ErrNotFound = errors.New("no such attempt")
)

// Defaults of Config.
const (
	CallTimeoutDefault      = 10 * time.Second
	CheckIntervalDefault    = time.Second
	MaxCheckIntervalDefault = 5 * time.Minute
	MaxChecksDefault        = 20
	MaxAgeDefault           = 24 * time.Hour
	ReconcileBatchDefault   = 100
	ReconcilePollDefault    = time.Second
	ResumePollDefault       = 10 * time.Second
)

// MaxKeyBytes bounds a key and a name.
const MaxKeyBytes = 255

// Config configures a Caller.
type Config struct {
	// Name names the kind of effect, e.g. "payments.charge". Keys are unique
	// per name; metrics and status are by name. Required.
	Name string
	// Schema is the PostgreSQL schema holding the side_effects table
	// (created by outboxmigrate, migration 7), as a plain string: the older
	// field, kept working; prefer Tables. Defaults to "outbox".
	Schema string
	// Tables is the schema holding the side_effects table: the one outbox.Schema value
	// an application gives every component's config. Setting it and Schema
	// to different names is refused (outbox.ErrSchemaConflict). Defaults to
	// Schema, then "outbox".
	Tables outbox.Schema
	// Mode is what the provider offers. Required.
	Mode Mode
	// Lookup asks the provider what happened to a key. Required for
	// Queryable, optional for Idempotent (Do and the reconciler then ask
	// before calling again), not allowed for Neither.
	Lookup Lookup
	// BlindRetry, in mode Neither only, makes Do call again after an
	// unknown attempt, with the same key, at the risk of a duplicate
	// effect; each such call is counted (side_effects.blind_retries, the
	// blind-retry metric). Defaults to false: the attempt is parked.
	BlindRetry bool
	// CallTimeout bounds each call and each lookup: their ctx ends then.
	// Defaults to CallTimeoutDefault.
	CallTimeout time.Duration
	// Lease is how long a claim lasts: past it, a started attempt is taken
	// to be abandoned (its caller crashed) and treated as unknown. It must
	// exceed CallTimeout, with room for the database writes. Half of the
	// room, (Lease - CallTimeout) / 2, is how late after its claim a call
	// may still start: Do checks it just before calling and refuses a later
	// call (ErrLeaseExpired); the other half is left after the call's
	// timeout for its record. Defaults to 3 × CallTimeout.
	Lease time.Duration
	// CheckInterval is the wait before the first check of an unknown
	// attempt; each further check waits twice as long, up to
	// MaxCheckInterval. Default CheckIntervalDefault and
	// MaxCheckIntervalDefault.
	CheckInterval    time.Duration
	MaxCheckInterval time.Duration
	// MaxChecks and MaxAge bound the resolution of an unknown attempt: after
	// MaxChecks lookups, or MaxAge after its outcome became unknown, it is
	// parked for an operator. Defaults MaxChecksDefault and MaxAgeDefault.
	MaxChecks int
	MaxAge    time.Duration
	// ReconcileBatch is the most attempts one ReconcileOnce checks, and
	// ReconcilePoll how often Reconcile looks for due ones. Defaults
	// ReconcileBatchDefault and ReconcilePollDefault.
	ReconcileBatch int
	ReconcilePoll  time.Duration
	// ResumePoll is how often Resume looks for waiting events whose attempt
	// is no longer parked, besides the notification a resolution sends
	// (which wakes it at once). The poll finds what no notification
	// announces: an attempt resolved while the listening connection was
	// down, or by a database/sql driver that cannot listen, and a wait due
	// again after its handler failed. Defaults to ResumePollDefault.
	ResumePoll time.Duration
	// Observer is told every call, lookup, replay and park, for metrics
	// (package outboxprom). Optional.
	Observer Observer
	// Logger receives a warning when a round of Reconcile or Resume fails,
	// or a waiting event's handler fails other than with Do's "not yet"
	// errors (ErrParked, ErrUnknown, ErrInProgress, ErrLeaseExpired,
	// ErrLeaseLost). Defaults to slog.Default().
	Logger *slog.Logger
	// Clock is the caller's clock for its leases: a claim's lease ends Lease
	// after the claiming statement was sent by this clock, and Do refuses a
	// call that this clock says starts too late (see Lease). It must move
	// forward with real time; a test that moves the database's now() ahead
	// (to expire leases without waiting) moves this clock by as much.
	// Defaults to time.Now.
	Clock func() time.Time
}

// Caller makes one external call per key safely: see the package
// documentation. It is safe for concurrent use, by any number of processes.
type Caller struct {
	db     pgtx.DB
	sqlDB  bool // built by NewSQL: Resume's handler gets a database/sql transaction
	cfg    Config
	schema string
	t      string // the table, quoted
	ops    string // the audit log, quoted
	waits  string // the waits on parked attempts, quoted
}

// New returns a Caller over pool, which must reach a schema migrated by
// outboxmigrate (version 7 or later).
func New(pool *pgxpool.Pool, cfg Config) (*Caller, error) {
	if pool == nil {
		return nil, errors.New("sideeffect: New needs a pool")
	}
	return newCaller(pgtx.Pool(pool), false, cfg)
}

// NewSQL returns a Caller over db, a database/sql database (the one sqlx,
// GORM, bun or ent hand out, over any PostgreSQL driver), which must reach
// a schema migrated by outboxmigrate (version 7 or later). It is the same
// Caller as New's: the same table, statements, states and errors; its
// transactions are database/sql ones.
func NewSQL(db *sql.DB, cfg Config) (*Caller, error) {
	if db == nil {
		return nil, errors.New("sideeffect: NewSQL needs a database")
	}
	return newCaller(pgtx.Database(db), true, cfg)
}

func newCaller(db pgtx.DB, sqlDB bool, cfg Config) (*Caller, error) {
	if err := checkName("Config.Name", cfg.Name); err != nil {
		return nil, err
	}
	s, err := pgident.Pick(string(cfg.Tables), cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: %w", err)
	}
	switch cfg.Mode {
	case Idempotent:
	case Queryable:
		if cfg.Lookup == nil {
			return nil, errors.New("sideeffect: mode queryable needs Config.Lookup: an unknown attempt must be looked up before it is called again")
		}
	case Neither:
		if cfg.Lookup != nil {
			return nil, errors.New("sideeffect: mode neither takes no Config.Lookup (a provider that can be queried by key is mode queryable)")
		}
	default:
		return nil, fmt.Errorf("sideeffect: Config.Mode is required (Idempotent, Queryable or Neither), got %v", cfg.Mode)
	}
	if cfg.BlindRetry && cfg.Mode != Neither {
		return nil, errors.New("sideeffect: Config.BlindRetry applies to mode neither only")
	}
	if cfg.CallTimeout < 0 || cfg.Lease < 0 || cfg.CheckInterval < 0 || cfg.MaxCheckInterval < 0 ||
		cfg.MaxChecks < 0 || cfg.MaxAge < 0 || cfg.ReconcileBatch < 0 || cfg.ReconcilePoll < 0 || cfg.ResumePoll < 0 {
		return nil, errors.New("sideeffect: durations and counts in Config must not be negative")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.CallTimeout, CallTimeoutDefault)
	def(&cfg.Lease, 3*cfg.CallTimeout)
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	def(&cfg.CheckInterval, CheckIntervalDefault)
	def(&cfg.MaxCheckInterval, MaxCheckIntervalDefault)
	def(&cfg.MaxAge, MaxAgeDefault)
	def(&cfg.ReconcilePoll, ReconcilePollDefault)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxChecks == 0 {
		cfg.MaxChecks = MaxChecksDefault
	}
	if cfg.ReconcileBatch == 0 {
		cfg.ReconcileBatch = ReconcileBatchDefault
	}
	if cfg.Lease <= cfg.CallTimeout {
		return nil, fmt.Errorf("sideeffect: Config.Lease (%s) must exceed Config.CallTimeout (%s): a call must end before its claim does", cfg.Lease, cfg.CallTimeout)
	}
	def(&cfg.ResumePoll, ResumePollDefault)
	return &Caller{db: db, sqlDB: sqlDB, cfg: cfg, schema: s.Name(), t: s.Table("side_effects"), ops: s.Table("outbox_operations"),
		waits: s.Table("side_effect_waits")}, nil
}

// Name is the Caller's Config.Name.
func (c *Caller) Name() string { return c.cfg.Name }

// Key derives the idempotency key of one step of an event's handling:
// "<event id>/<step>". Use it when one event causes several external calls;
// a single call can use the event id itself.
func Key(eventID, step string) string { return eventID + "/" + step }

// Fingerprint is the sha256 of a request's canonical bytes, as Do records it.
func Fingerprint(request []byte) [32]byte { return sha256.Sum256(request) }

func checkName(what, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("sideeffect: %s is required", what)
	case len(v) > MaxKeyBytes:
		return fmt.Errorf("sideeffect: %s is %d bytes, more than %d", what, len(v), MaxKeyBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("sideeffect: %s is not valid UTF-8", what)
	}
	return nil
}

// backoff is the wait before the check following `checks` checks.
func (c *Caller) backoff(checks int) time.Duration {
	return backoff.Exponential(checks, c.cfg.CheckInterval, c.cfg.MaxCheckInterval)
}
