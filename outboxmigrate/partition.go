package outboxmigrate

// A partitioned outbox: outbox_events as a table partitioned by RANGE
// (event_id), whose settled partitions the relay drops instead of deleting
// their rows (docs/operations.md, "Partitioned outbox"; docs/design.md,
// "A partitioned outbox").

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/partman"
	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

const (
	// PartitionIntervalDefault is the default width of a partition: one
	// hour of event ids.
	PartitionIntervalDefault = time.Hour
	// PartitionAheadDefault is the default number of partitions kept
	// ready after the current one.
	PartitionAheadDefault = 6
)

// PartitionConfig says how Partition partitions outbox_events.
type PartitionConfig struct {
	// Interval is the width of a partition, in the time its event ids
	// (UUIDv7s) hold: partitions are dropped whole, so the table holds
	// the replay horizon plus up to one interval of settled events, and
	// the claim reads one index per partition. Whole seconds, at least
	// one second. Defaults to PartitionIntervalDefault (1 hour).
	Interval time.Duration
	// Ahead is how many partitions are created after the current one;
	// the relay's upkeep keeps that many ready. An event whose id falls
	// after the last partition is refused, so this is how long writes go
	// on while no upkeep runs. Defaults to PartitionAheadDefault (6).
	Ahead int
}

func (c PartitionConfig) withDefaults() (PartitionConfig, error) {
	if c.Interval == 0 {
		c.Interval = PartitionIntervalDefault
	}
	if c.Ahead == 0 {
		c.Ahead = PartitionAheadDefault
	}
	switch {
	case c.Interval < time.Second || c.Interval%time.Second != 0:
		return c, fmt.Errorf("outboxmigrate: partition interval %s: use whole seconds, at least 1s", c.Interval)
	case c.Ahead < 1:
		return c, fmt.Errorf("outboxmigrate: %d partitions ahead: use at least 1", c.Ahead)
	}
	return c, nil
}

// PartitionResult reports what Partition did.
type PartitionResult struct {
	// Converted is true when this call made outbox_events partitioned;
	// false when it already was.
	Converted bool
	// Kept is the partition the events already in the table became ("" when
	// the table was empty and was replaced).
	Kept string
	// Created are the partitions created (ahead of time).
	Created []string
}

// ErrNotTimeOrdered is wrapped by Partition's refusal of a table whose
// event ids are not time-ordered (not UUIDv7s, or from a clock ahead): they
// cannot become one range partition followed by the partitions of the ids
// to come.
var ErrNotTimeOrdered = errors.New("the event ids already in outbox_events are not time-ordered UUIDv7s")

// rangeCheck is the CHECK constraint that proves the events already in the
// table fit the range of their partition, so that ATTACH PARTITION need
// not scan the table under its lock.
const rangeCheck = "outbox_events_partition_range"

// laneIndex is the partitioned table's index of (aggregate_type,
// aggregate_id, aggregate_sequence): PostgreSQL requires the partition key
// in every unique index of a partitioned table, so the UNIQUE constraint
// of migration 001 becomes this plain index. Sequences come from the
// counter row (outbox_aggregates) under its lock; the constraint was a
// safety net, and nothing writes with ON CONFLICT on it.
const laneIndex = "outbox_events_lane_idx"

// Partition makes schema's outbox_events a table partitioned by RANGE
// (event_id), with bounds at multiples of cfg.Interval of the time a
// UUIDv7 id holds, and creates cfg.Ahead partitions ahead. The schema must
// be migrated to the latest version first (Migrate); later migrations
// apply to the partitioned table.
//
// A table already partitioned is left as it is (the partitions due ahead
// are created). An empty table is replaced. A table with events keeps them
// in place: it becomes the first partition, covering its ids up to the end
// of the interval after the current one, and the partitions of the ids to
// come follow it (at least one, with Ahead 1 too: the newest partition's
// width is the one the upkeep makes the next ones with). Before the short step that swaps the tables, the
// conversion proves the events fit that range with a CHECK constraint
// validated online (a scan that does not block writers, SHARE UPDATE
// EXCLUSIVE) and builds the new parent's lane index on the table
// concurrently; ids from the future or not UUIDv7s (UUIDv4s supplied by
// the application) fail that check, and Partition refuses with an error
// wrapping ErrNotTimeOrdered, having changed nothing but for the index.
// The swap then takes an ACCESS EXCLUSIVE lock on the table for a
// catalogue change only: the rights granted on the table and its columns
// move to the parent, and a publication of the table (CDC) publishes the
// parent, with publish_via_partition_root.
//
// Run it as the tables' owner, the role that ran Migrate.
func Partition(ctx context.Context, pool *pgxpool.Pool, schema string, cfg PartitionConfig) (PartitionResult, error) {
	var res PartitionResult
	cfg, err := cfg.withDefaults()
	if err != nil {
		return res, err
	}
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return res, err
	}
	db := pgtx.Pool(pool)
	v, err := Version(ctx, pool, schema)
	if err != nil {
		return res, err
	}
	if latest := All()[len(All())-1].Version; v != latest {
		return res, fmt.Errorf("outboxmigrate: partition %s: the schema is at version %d, not %d: migrate it first", s.Name(), v, latest)
	}
	parted, err := partman.IsPartitioned(ctx, db, s)
	if err != nil {
		return res, err
	}
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return res, err
	}
	if parted {
		res.Created, err = partman.EnsureAhead(ctx, db, s, now, cfg.Ahead)
		return res, err
	}
	events := s.Table("outbox_events")
	var minID, maxID *uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT (SELECT event_id FROM `+events+` ORDER BY event_id LIMIT 1), (SELECT event_id FROM `+events+` ORDER BY event_id DESC LIMIT 1)`).Scan(&minID, &maxID); err != nil {
		return res, err
	}
	// The events in the table get the range [lo, hi): hi is the end of the
	// interval after now's, so that writers go on inserting while the
	// check is validated.
	hi := partman.Align(now, cfg.Interval).Add(2 * cfg.Interval)
	var lo time.Time
	if minID != nil {
		lo = partman.Align(partman.TimeOf(*minID), cfg.Interval)
		if !partman.TimeOf(*maxID).Before(hi) {
			return res, notTimeOrdered(*maxID, hi)
		}
		if err := proveRange(ctx, pool, s, lo, hi); err != nil {
			return res, err
		}
		// The parent's lane index replaces the UNIQUE constraint; the
		// attach would build it under its lock if the table had none.
		if _, err := pool.Exec(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+pgx.Identifier{laneIndex}.Sanitize()+` ON `+events+
			` (aggregate_type, aggregate_id, aggregate_sequence)`); err != nil {
			err = fmt.Errorf("outboxmigrate: partition %s: build %s: %w", s.Name(), laneIndex, err)
			return res, dropRangeCheck(ctx, pool, s, hi, err)
		}
	}
	err = db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		var err error
		res, err = swap(ctx, tx, s, cfg, now, lo, hi)
		return err
	})
	if err != nil {
		err = fmt.Errorf("outboxmigrate: partition %s: %w", s.Name(), err)
		if !lo.IsZero() {
			err = dropRangeCheck(ctx, pool, s, hi, err)
		}
		return PartitionResult{}, err
	}
	return res, nil
}

// dropRangeCheck removes the range check from the plain table after a
// conversion failed past proveRange, and returns failed: left there, the
// check refuses every event whose id is after hi (SQLSTATE 23514), every
// event once hi is past. It waits at most lockTimeout for its lock; when it
// cannot drop the check, the error says so.
func dropRangeCheck(ctx context.Context, pool *pgxpool.Pool, s pgident.Schema, hi time.Time, failed error) error {
	ctx = context.WithoutCancel(ctx)
	err := pgtx.Pool(pool).BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ALTER TABLE `+s.Table("outbox_events")+` DROP CONSTRAINT IF EXISTS `+pgx.Identifier{rangeCheck}.Sanitize())
		return err
	})
	if err != nil {
		return fmt.Errorf("%w; and the check %s it added is still on %s, where it refuses every event id after %s: "+
			"drop it (ALTER TABLE %s DROP CONSTRAINT %s) or run the conversion again: %v",
			failed, rangeCheck, s.Table("outbox_events"), hi.Format(time.RFC3339), s.Table("outbox_events"), rangeCheck, err)
	}
	return failed
}

func notTimeOrdered(id uuid.UUID, hi time.Time) error {
	return fmt.Errorf("outboxmigrate: %w: event %s reads as %s, after %s (the end of the next interval); "+
		"ids from an application that supplies its own (UUIDv4, say) cannot be partitioned by time: "+
		"let the Writer or new_event_id() make them (UUIDv7), and clean up or move the old events before converting",
		ErrNotTimeOrdered, id, partman.TimeOf(id).Format(time.RFC3339), hi.Format(time.RFC3339))
}

// proveRange adds and validates the range check, online; a violation is
// ErrNotTimeOrdered, and the check is removed again.
func proveRange(ctx context.Context, pool *pgxpool.Pool, s pgident.Schema, lo, hi time.Time) error {
	events := s.Table("outbox_events")
	check := pgx.Identifier{rangeCheck}.Sanitize()
	if _, err := pool.Exec(ctx, `ALTER TABLE `+events+` DROP CONSTRAINT IF EXISTS `+check); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE `+events+` ADD CONSTRAINT `+check+` CHECK (event_id >= '`+
		partman.Bound(lo).String()+`' AND event_id < '`+partman.Bound(hi).String()+`') NOT VALID`); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `ALTER TABLE `+events+` VALIDATE CONSTRAINT `+check)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23514" {
		_, _ = pool.Exec(context.WithoutCancel(ctx), `ALTER TABLE `+events+` DROP CONSTRAINT IF EXISTS `+check)
		var id uuid.UUID
		if qerr := pool.QueryRow(ctx, `SELECT event_id FROM `+events+` WHERE NOT (event_id >= $1 AND event_id < $2) LIMIT 1`,
			partman.Bound(lo), partman.Bound(hi)).Scan(&id); qerr == nil {
			return notTimeOrdered(id, hi)
		}
		return fmt.Errorf("outboxmigrate: %w: %v", ErrNotTimeOrdered, err)
	}
	return err
}

// swap replaces outbox_events by a partitioned table of the same shape, in
// tx: the old table becomes its first partition [lo, hi) (lo is zero when
// the old table is empty: it is dropped).
func swap(ctx context.Context, tx pgtx.Querier, s pgident.Schema, cfg PartitionConfig, now, lo, hi time.Time) (PartitionResult, error) {
	var res PartitionResult
	events := s.Table("outbox_events")
	if _, err := tx.Exec(ctx, `LOCK TABLE `+events+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		return res, err
	}
	parted, err := partman.IsPartitioned(ctx, tx, s)
	if err != nil || parted {
		return res, err // another process converted it meanwhile
	}
	// On a partitioned table every write moves its counter row exactly
	// (migration 020): without a UNIQUE index across partitions, the
	// counter is what keeps sequences apart. Unpartitioned, a write in READ
	// COMMITTED left it a floor and took its sequence from the lane's last
	// event: raise every counter to its lane's last event, under the lock
	// (writers take outbox_events' lock before their counter rows, so none
	// holds one while waiting for this).
	if _, err := tx.Exec(ctx, `UPDATE `+s.Table("outbox_aggregates")+` a SET last_sequence = m.top
FROM (SELECT aggregate_type, aggregate_id, max(aggregate_sequence) AS top FROM `+events+` GROUP BY 1, 2) m
WHERE a.aggregate_type = m.aggregate_type AND a.aggregate_id = m.aggregate_id AND a.last_sequence < m.top`); err != nil {
		return res, fmt.Errorf("make the counters exact: %w", err)
	}
	if lo.IsZero() {
		var any bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+events+`)`).Scan(&any); err != nil {
			return res, err
		}
		if any {
			return res, errors.New("events were written while converting the empty table: run it again")
		}
	}
	old := partman.Name(lo)
	if lo.IsZero() {
		old = "outbox_events_unpartitioned"
	}
	opts, err := partman.Options(ctx, tx, s, "outbox_events")
	if err != nil {
		return res, err
	}
	// (A regrole prints quoted where the role's name needs it: no
	// quote_ident on top.)
	// What the parent must have: the old table's CHECK constraints (NOT
	// VALID ones stay so: ATTACH refuses a child whose constraint is NOT
	// VALID under a valid one of the parent), its indexes but for those
	// of constraints (the primary key is added again; the UNIQUE
	// constraint becomes laneIndex), and the rights on it.
	checks, err := strs(ctx, tx, `SELECT format('ALTER TABLE %s ADD CONSTRAINT %I %s', $1::text, conname, pg_get_constraintdef(oid))
FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c' AND conname <> $2 ORDER BY conname`, events, rangeCheck)
	if err != nil {
		return res, err
	}
	indexes, err := strs(ctx, tx, `SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = $1::regclass AND c.relname <> $2
  AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid)
ORDER BY c.relname`, events, laneIndex)
	if err != nil {
		return res, err
	}
	grants, err := strs(ctx, tx, `SELECT format('GRANT %s ON %s TO %s', a.privilege_type, $1::text,
	CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END)
FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = $1::regclass AND a.grantee <> c.relowner
UNION ALL
SELECT format('GRANT %s (%I) ON %s TO %s', a.privilege_type, t.attname, $1::text,
	CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END)
FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid, aclexplode(t.attacl) a
WHERE t.attrelid = $1::regclass AND t.attnum > 0 AND NOT t.attisdropped AND a.grantee <> c.relowner`, events)
	if err != nil {
		return res, err
	}
	pubs, err := strs(ctx, tx, `SELECT p.pubname FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
WHERE r.prrelid = $1::regclass ORDER BY 1`, events)
	if err != nil {
		return res, err
	}
	// Out of the way: the old table and its indexes get names of their own.
	oldIdx, err := strs(ctx, tx, `SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass ORDER BY 1`, events)
	if err != nil {
		return res, err
	}
	stamp := strings.TrimPrefix(old, partman.Prefix)
	for _, name := range oldIdx {
		to := name
		if len(to) > 40 {
			to = to[:40]
		}
		to += "_" + stamp
		if _, err := tx.Exec(ctx, `ALTER INDEX `+s.Table(name)+` RENAME TO `+pgx.Identifier{to}.Sanitize()); err != nil {
			return res, err
		}
	}
	oldTable := s.Table(old)
	stmts := []string{
		`ALTER TABLE ` + events + ` RENAME TO ` + pgx.Identifier{old}.Sanitize(),
		`CREATE TABLE ` + events + ` (LIKE ` + oldTable + ` INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY RANGE (event_id)`,
		`ALTER TABLE ` + events + ` ADD CONSTRAINT outbox_events_pkey PRIMARY KEY (event_id)`,
		`CREATE INDEX ` + pgx.Identifier{laneIndex}.Sanitize() + ` ON ` + events + ` (aggregate_type, aggregate_id, aggregate_sequence)`,
	}
	stmts = append(stmts, checks...)
	stmts = append(stmts, indexes...)
	stmts = append(stmts, grants...)
	for _, p := range pubs {
		pub := pgx.Identifier{p}.Sanitize()
		stmts = append(stmts, `ALTER PUBLICATION `+pub+` DROP TABLE `+oldTable, `ALTER PUBLICATION `+pub+` ADD TABLE `+events,
			`ALTER PUBLICATION `+pub+` SET (publish_via_partition_root = true)`)
	}
	if lo.IsZero() {
		stmts = append(stmts, `DROP TABLE `+oldTable)
	} else {
		stmts = append(stmts, `ALTER TABLE `+events+` ATTACH PARTITION `+oldTable+` FOR VALUES FROM ('`+
			partman.Bound(lo).String()+`') TO ('`+partman.Bound(hi).String()+`')`,
			`ALTER TABLE `+oldTable+` DROP CONSTRAINT `+pgx.Identifier{rangeCheck}.Sanitize())
		res.Kept = old
	}
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			return res, fmt.Errorf("%s: %w", firstWords(q), err)
		}
	}
	// The kept partition covers the current interval and the next: with
	// one partition ahead (Ahead 1) none would follow it, and it would be
	// the newest, whose width the upkeep gives every partition it makes
	// (partman.Interval): as wide as the events kept, not cfg.Interval. At
	// least one partition of cfg.Interval follows it.
	ahead := cfg.Ahead
	if !lo.IsZero() {
		ahead = max(ahead, 2)
	}
	res.Created, err = partman.EnsureAheadIn(ctx, tx, s, now, ahead, cfg.Interval, opts)
	if err != nil {
		return res, err
	}
	res.Converted = true
	return res, nil
}

func strs(ctx context.Context, q pgtx.Querier, sql string, args ...any) ([]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func firstWords(q string) string {
	f := strings.Fields(q)
	if len(f) > 6 {
		f = f[:6]
	}
	return strings.Join(f, " ")
}
