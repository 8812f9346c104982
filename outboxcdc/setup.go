package outboxcdc

// Set-up: the publication on the outbox table's inserts and the relay
// group's logical replication slot, both created when missing.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgretry"
)

// ErrWALLevel is returned (wrapped) when the server's wal_level is not
// logical.
var ErrWALLevel = errors.New("logical decoding needs wal_level = logical")

// Setup checks that the server can decode its WAL and creates, when missing,
// the publication of the outbox table's inserts and the relay group's
// permanent logical replication slot (pgoutput), in that order: a slot only
// decodes publications that existed when it was created. It is idempotent
// and safe to run from several processes at once. Run calls it.
//
// It needs a role that may create publications on the table (its owner)
// and replication slots (REPLICATION or superuser).
func Setup(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	if cfg.Pool == nil {
		return errors.New("outboxcdc: Config.Pool is required")
	}
	if err := cfg.validateNames(); err != nil {
		return err
	}
	if err := checkWALLevel(ctx, cfg.Pool); err != nil {
		return err
	}
	if err := ensurePublication(ctx, cfg.Pool, cfg.Schema, cfg.Publication); err != nil {
		return err
	}
	if err := cfg.resolveSlot(ctx); err != nil {
		return err
	}
	_, err := ensureSlot(ctx, cfg.Pool, cfg.Slot)
	return err
}

// resolveSlot settles a defaulted Slot: SlotName's, unless that slot does
// not exist and one under the name an earlier version gave the group does
// (legacySlotName): then that one, which holds the group's position and
// WAL. It reports whether it took the earlier name.
func (c *Config) resolveSlot(ctx context.Context) error {
	if !c.slotDefault {
		return nil
	}
	legacy := legacySlotName(c.Schema, c.Group)
	if legacy == c.Slot {
		c.slotDefault = false
		return nil
	}
	current, err := slotInfo(ctx, c.Pool, c.Slot)
	if err != nil || current.exists {
		c.slotDefault = err != nil
		return err
	}
	old, err := slotInfo(ctx, c.Pool, legacy)
	if err != nil {
		return err
	}
	if old.exists && old.plugin == "pgoutput" && old.sameDatabase {
		c.Slot, c.legacySlot = legacy, true
	}
	c.slotDefault = false
	return nil
}

func checkWALLevel(ctx context.Context, pool *pgxpool.Pool) error {
	var level string
	if err := pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		return fmt.Errorf("outboxcdc: read wal_level: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("outboxcdc: wal_level is %s: %w (set wal_level = logical in postgresql.conf or with ALTER SYSTEM, and restart PostgreSQL; also check max_replication_slots and max_wal_senders)", level, ErrWALLevel)
	}
	return nil
}

func ensurePublication(ctx context.Context, pool *pgxpool.Pool, schema, name string) error {
	exists, err := checkPublication(ctx, pool, schema, name)
	if err != nil || exists {
		return err
	}
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{name}.Sanitize()+` FOR TABLE `+s.Table("outbox_events")+
		` WITH (publish = 'insert', publish_via_partition_root = true)`)
	if isCode(err, "42710") { // duplicate_object: another process created it
		return nil
	}
	if err != nil {
		return fmt.Errorf("outboxcdc: create publication %s: %w", name, err)
	}
	return nil
}

// checkPublication reports whether the publication exists, and an error
// wrapping errForeignPublication when it does and does not publish every
// insert into the outbox table whole. Setup checks it at start; a running
// stream checks it again at each connection and every StatusInterval,
// because an ALTER PUBLICATION takes effect in the WAL sender at once.
func checkPublication(ctx context.Context, pool *pgxpool.Pool, schema, name string) (bool, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return false, err
	}
	// A publication of that name made or altered by hand must publish every
	// insert into the table, whole: a stream that reads only some of them
	// reports itself streaming while the rest wait for the safety net. The
	// row filter and column list (PostgreSQL 15) are read through to_jsonb,
	// which works on servers without those columns.
	// On a partitioned outbox_events (outboxmigrate.Partition) the stream
	// must see the inserts as the parent's: publish_via_partition_root,
	// which the publication this package creates has (and the conversion
	// sets on the publications of the table). Without it
	// pg_publication_tables lists the partitions, and the table is not
	// covered.
	var exists, covers, inserts, whole, viaRoot bool
	err = pool.QueryRow(ctx, `SELECT
		coalesce((SELECT p.pubviaroot OR c.relkind <> 'p' FROM pg_publication p, pg_class c
		          WHERE p.pubname = $1 AND c.oid = to_regclass(format('%I.outbox_events', $2::text))), true),
		EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
		EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = 'outbox_events'),
		coalesce((SELECT pubinsert FROM pg_publication WHERE pubname = $1), false),
		NOT EXISTS (SELECT 1 FROM pg_publication_tables t WHERE pubname = $1 AND schemaname = $2 AND tablename = 'outbox_events'
			AND (to_jsonb(t) ->> 'rowfilter' IS NOT NULL
				OR (to_jsonb(t) -> 'attnames') IS NOT NULL AND jsonb_typeof(to_jsonb(t) -> 'attnames') = 'array'
					AND NOT (to_jsonb(t) -> 'attnames') ?& ARRAY['event_id', 'aggregate_type', 'aggregate_id']))`,
		name, s.Name()).Scan(&viaRoot, &exists, &covers, &inserts, &whole)
	if err != nil {
		return false, fmt.Errorf("outboxcdc: look up publication %s: %w", name, err)
	}
	if !exists {
		return false, nil
	}
	switch {
	case !viaRoot:
		return true, fmt.Errorf("outboxcdc: publication %s exists but %s.outbox_events is partitioned and the publication lacks publish_via_partition_root = true (ALTER PUBLICATION %s SET (publish_via_partition_root = true)): %w",
			name, s.Name(), name, errForeignPublication)
	case !covers:
		return true, fmt.Errorf("outboxcdc: publication %s exists but %w %s.outbox_events", name, errForeignPublication, s.Name())
	case !inserts:
		return true, fmt.Errorf("outboxcdc: publication %s exists but does not publish inserts (publish = 'insert' needed): %w", name, errForeignPublication)
	case !whole:
		return true, fmt.Errorf("outboxcdc: publication %s exists but filters %s.outbox_events (a row filter, or a column list without event_id, aggregate_type and aggregate_id): %w", name, s.Name(), errForeignPublication)
	}
	return true, nil
}

// ensureSlot creates the slot when it does not exist and reports whether it
// did.
func ensureSlot(ctx context.Context, pool *pgxpool.Pool, slot string) (created bool, err error) {
	info, err := slotInfo(ctx, pool, slot)
	if err != nil {
		return false, err
	}
	if info.exists {
		if info.plugin != "pgoutput" || !info.sameDatabase {
			return false, fmt.Errorf("outboxcdc: replication slot %s exists but is %w", slot, errForeignSlot)
		}
		return false, nil
	}
	_, err = pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	if isCode(err, "42710") {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("outboxcdc: create replication slot %s: %w", slot, err)
	}
	return true, nil
}

// slot is what pg_replication_slots says about a slot.
type slot struct {
	exists, sameDatabase, active bool
	plugin, walStatus            string
	activePID                    int
	confirmed                    pglogrepl.LSN // confirmed_flush_lsn
	restart                      pglogrepl.LSN // restart_lsn
}

// slotInfoRetryFor is how long slotInfo tries again after a lost connection.
const slotInfoRetryFor = 2 * time.Second

func slotInfo(ctx context.Context, pool *pgxpool.Pool, name string) (slot, error) {
	var s slot
	var plugin, walStatus *string
	var pid *int32
	var confirmed, restart *string
	// A read: tried again on another connection when the pool's was lost
	// (a standby looks every StandbyInterval; a pooled connection killed
	// while idle, as idle_session_timeout or a pooler does, must not end
	// its standing by and make it unready).
	err := pgretry.Do(ctx, time.Now().Add(slotInfoRetryFor), func(ctx context.Context, _ pgretry.Attempt) error {
		return pool.QueryRow(ctx, `SELECT plugin, coalesce(database = current_database(), false), active, active_pid, wal_status,
		confirmed_flush_lsn::text, restart_lsn::text
		FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&plugin, &s.sameDatabase, &s.active, &pid, &walStatus, &confirmed, &restart)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("outboxcdc: look up replication slot %s: %w", name, err)
	}
	s.exists = true
	if plugin != nil {
		s.plugin = *plugin
	}
	if walStatus != nil {
		s.walStatus = *walStatus
	}
	if pid != nil {
		s.activePID = int(*pid)
	}
	if confirmed != nil {
		s.confirmed, _ = pglogrepl.ParseLSN(*confirmed)
	}
	if restart != nil {
		s.restart, _ = pglogrepl.ParseLSN(*restart)
	}
	return s, nil
}

// recreateLostSlot drops an invalidated slot and creates it again at the
// current position. The events committed in between are never read from
// the WAL: the polling safety net publishes them from the table.
func recreateLostSlot(ctx context.Context, pool *pgxpool.Pool, name string) error {
	if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name); err != nil && !isCode(err, "42704") {
		return fmt.Errorf("outboxcdc: drop invalidated replication slot %s: %w", name, err)
	}
	_, err := ensureSlot(ctx, pool, name)
	return err
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
