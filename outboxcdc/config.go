package outboxcdc

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox"
	"github.com/pgoutbox/outbox/internal/pgident"
)

// Defaults for Config.
const (
	// GroupDefault is Config.Group's default.
	GroupDefault = "default"
	// BatchSizeDefault is Config.BatchSize's default.
	BatchSizeDefault = outbox.BatchSizeDefault
	// FlushIntervalDefault is Config.FlushInterval's default.
	FlushIntervalDefault = 2 * time.Millisecond
	// StatusIntervalDefault is Config.StatusInterval's default.
	StatusIntervalDefault = 10 * time.Second
	// RetryMinDefault and RetryMaxDefault are Config.RetryMin's and
	// Config.RetryMax's defaults.
	RetryMinDefault = 500 * time.Millisecond
	RetryMaxDefault = 10 * time.Second
	// MaxQueuedDefault is Config.MaxQueued's default: about 5 MB of ids.
	MaxQueuedDefault = 100_000
	// WaitLimitDefault is Config.WaitLimit's default.
	WaitLimitDefault = time.Minute
	// StandbyIntervalDefault is Config.StandbyInterval's default.
	StandbyIntervalDefault = 500 * time.Millisecond
)

// Config configures a CDC relay.
type Config struct {
	// DatabaseURL is the PostgreSQL connection URL of the database holding
	// the outbox tables. The replication connection is opened on it (with
	// replication=database added); its user needs the REPLICATION attribute
	// (or superuser). Required.
	DatabaseURL string
	// Pool runs the set-up statements (publication, slot) and the slot
	// checks. Required.
	Pool *pgxpool.Pool
	// Schema is the schema holding the outbox tables, as a plain string:
	// the older field, kept working; prefer Tables. Defaults to "outbox".
	Schema string
	// Tables is the schema holding the outbox tables: the one outbox.Schema value
	// an application gives every component's config. Setting it and Schema
	// to different names is refused (outbox.ErrSchemaConflict). Defaults to
	// Schema, then "outbox".
	Tables outbox.Schema
	// Group names the relay group: the relays of one group share one slot
	// (one streams, the others stand by). Defaults to GroupDefault.
	Group string
	// Slot is the replication slot's name. Defaults to SlotName(Schema,
	// Group), or, when that slot does not exist and one under the name an
	// earlier version gave it does, to that one (see SlotName).
	Slot string
	// slotDefault: Slot was not set, and Setup or Run may still take the
	// name of an earlier version's slot (resolveSlot).
	slotDefault bool
	// legacySlot: resolveSlot took the earlier version's name.
	legacySlot bool
	// Publication is the publication's name. Defaults to
	// PublicationName(Schema).
	Publication string
	// Relay publishes the ids read from the WAL (Relay.PublishIDs). It must
	// not be running (its Run not called): the CDC path owns it. Required.
	Relay *outbox.Relay
	// SafetyNet, when set, is a polling relay Run runs beside the stream
	// (build it with RelayConfig.ReconcileAfter set, and its own ID): it
	// publishes whatever the CDC path left or could not read, such as the
	// gap of an invalidated slot. When nil, the caller must run one (the
	// command `outbox relay --mode cdc` does), or events left by the CDC
	// path wait for a relay in `--mode reconcile` or polling elsewhere.
	SafetyNet *outbox.Relay
	// BatchSize is the most ids handed to one PublishIDs call. Defaults to
	// BatchSizeDefault.
	BatchSize int
	// FlushInterval is how long committed ids wait for more before they are
	// published: the most this adds to commit-to-publish latency. Defaults
	// to FlushIntervalDefault.
	FlushInterval time.Duration
	// StatusInterval is how often the stream reports its confirmed position
	// to PostgreSQL when nothing else makes it (keep it well under the
	// server's wal_sender_timeout), and how often it checks that the
	// publication still publishes every insert into the outbox table (Run
	// returns the reason when not). Defaults to StatusIntervalDefault.
	StatusInterval time.Duration
	// RetryMin and RetryMax bound the backoff (with jitter) between
	// attempts to stream after an error, and before retrying a database
	// error of PublishIDs. Default to RetryMinDefault and RetryMaxDefault.
	RetryMin, RetryMax time.Duration
	// MaxQueued bounds the event ids the stream holds in memory: read from
	// the WAL and not finished yet (waiting for a PublishIDs call, in one,
	// or waiting for their aggregate's earlier event). Publishing runs
	// beside the reading, so a slow destination or database never stops
	// the stream from reading and answering the server; when MaxQueued ids
	// are held, the stream goes on reading but queues no more: the slot is
	// not confirmed past the transactions it did not queue, and once the
	// ids before them are finished the stream starts again from the slot's
	// confirmed position and reads them again (the safety net covers them
	// meanwhile). Defaults to MaxQueuedDefault.
	MaxQueued int
	// WaitLimit bounds how long the stream keeps an id it could not
	// publish yet and hands it over again: an event behind an unpublished
	// event of its aggregate (published by another relay, or still
	// arriving), leased by another relay, or backing off after a failure.
	// It is handed over again as soon as its predecessor may have been
	// published (with the next call that carries an event of its
	// aggregate, and at least every 100 ms), so that a lane's events go
	// out one after the other whoever publishes its head. The slot is not
	// confirmed past it while it waits; past WaitLimit it is left to the
	// safety net. Defaults to WaitLimitDefault.
	WaitLimit time.Duration
	// StandbyInterval is how often a relay whose slot another process
	// streams looks whether the slot is free (pg_replication_slots.active,
	// one query), with jitter between half and all of it: a standby takes
	// over within about StandbyInterval of the streaming process's WAL
	// sender ending, and asks nothing of the server that fails (a
	// START_REPLICATION on an active slot is an ERROR in the server's log).
	// Defaults to StandbyIntervalDefault.
	StandbyInterval time.Duration
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Group == "" {
		c.Group = GroupDefault
	}
	if c.Schema == "" {
		c.Schema = string(c.Tables)
	}
	if c.Schema == "" {
		c.Schema = pgident.DefaultSchema
	}
	if c.Slot == "" {
		c.Slot, c.slotDefault = SlotName(c.Schema, c.Group), true
	}
	if c.Publication == "" {
		c.Publication = PublicationName(c.Schema)
	}
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.FlushInterval, FlushIntervalDefault)
	def(&c.StatusInterval, StatusIntervalDefault)
	def(&c.RetryMin, RetryMinDefault)
	def(&c.RetryMax, RetryMaxDefault)
	def(&c.WaitLimit, WaitLimitDefault)
	def(&c.StandbyInterval, StandbyIntervalDefault)
	if c.MaxQueued == 0 {
		c.MaxQueued = MaxQueuedDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("outboxcdc: Config.DatabaseURL is required")
	case c.Pool == nil:
		return errors.New("outboxcdc: Config.Pool is required")
	case c.Relay == nil:
		return errors.New("outboxcdc: Config.Relay is required")
	case c.BatchSize < 1:
		return fmt.Errorf("outboxcdc: BatchSize %d must be positive", c.BatchSize)
	case c.MaxQueued < c.BatchSize:
		return fmt.Errorf("outboxcdc: MaxQueued %d is below BatchSize %d", c.MaxQueued, c.BatchSize)
	case c.FlushInterval < 0 || c.StatusInterval < 0 || c.RetryMin < 0 || c.WaitLimit < 0 || c.StandbyInterval < 0:
		return errors.New("outboxcdc: durations must not be negative")
	case c.RetryMax < c.RetryMin:
		return fmt.Errorf("outboxcdc: RetryMax %s is below RetryMin %s", c.RetryMax, c.RetryMin)
	}
	return c.validateNames()
}

func (c Config) validateNames() error {
	if _, err := pgident.Pick(string(c.Tables), c.Schema); err != nil {
		return fmt.Errorf("outboxcdc: %w", err)
	}
	for _, n := range []struct{ what, name string }{{"slot", c.Slot}, {"publication", c.Publication}} {
		if err := validName(n.name); err != nil {
			return fmt.Errorf("outboxcdc: %s name %q: %w", n.what, n.name, err)
		}
	}
	return nil
}

// SlotName is the default replication slot name of a relay group:
// "outbox_<schema>_<group>", lower-cased, with every character other than
// a-z, 0-9 and _ replaced by _ (what PostgreSQL allows in a slot name). When
// the schema or the group holds anything but a-z and 0-9, the name ends with
// a hash of the two: joined with "_", such pairs are ambiguous (schema
// "shop" with group "eu_1" and schema "shop_eu" with group "1" gave the same
// name, so the two schemas shared one slot), and so are names that differ
// only in case or in a character mapped to "_". A name longer than 63 bytes
// is shortened, with the hash.
//
// Before this version the hash was only added to names over 63 bytes. A
// relay whose Config.Slot is unset and whose slot exists under that earlier
// name, but not under this one, keeps streaming it and logs once that it
// does (dropping it would drop its position and the WAL it holds; give
// Config.Slot, or --slot, to choose).
func SlotName(schema, group string) string {
	if plainName(schema) && plainName(group) {
		return identifier("outbox_" + schema + "_" + group)
	}
	h := fnv.New32a()
	h.Write([]byte(schema))
	h.Write([]byte{0})
	h.Write([]byte(group))
	b := identifierBytes("outbox_" + schema + "_" + group)
	return fmt.Sprintf("%s_%08x", b[:min(len(b), 54)], h.Sum32())
}

// legacySlotName is SlotName before the hash of ambiguous names.
func legacySlotName(schema, group string) string {
	return identifier("outbox_" + schema + "_" + group)
}

// plainName reports whether s holds only a-z and 0-9.
func plainName(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return s != ""
}

// PublicationName is the default publication name for a schema's outbox
// table: "outbox_<schema>_events", made an identifier like SlotName.
func PublicationName(schema string) string {
	return identifier("outbox_" + schema + "_events")
}

func identifier(s string) string {
	b := identifierBytes(s)
	if len(b) <= 63 {
		return string(b)
	}
	h := fnv.New32a()
	h.Write(b)
	return fmt.Sprintf("%s_%08x", b[:54], h.Sum32())
}

// identifierBytes is s lower-cased, with every byte other than a-z, 0-9
// and _ replaced by _.
func identifierBytes(s string) []byte {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return b
}

func validName(s string) error {
	if s == "" || len(s) > 63 {
		return errors.New("must be 1 to 63 bytes")
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return errors.New("may hold only a-z, 0-9 and _")
		}
	}
	return nil
}
