// Package partman keeps a partitioned outbox_events: the partitions' bounds
// and names, which partitions exist, creating them ahead of time, and
// detaching and dropping the ones whose events are all settled and past
// the replay horizon. outboxmigrate's conversion and the relay's upkeep
// (and Admin's status and clean-up) share it.
//
// # Bounds
//
// outbox_events is partitioned by RANGE (event_id). An event id is a
// UUIDv7 (the Writer's and the SQL API's new_event_id()): its first 48 bits
// are the Unix time in milliseconds, and PostgreSQL compares uuids byte by
// byte, so the ids of one time range form one range of uuids. A bound is
// the uuid whose first 48 bits are a time and whose other bits are zero.
// Partitions are aligned on multiples of their interval since the Unix
// epoch and named after their lower bound in UTC:
// outbox_events_p20260102t150000.
package partman

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/outbox/internal/pgident"
	"github.com/pgoutbox/outbox/internal/pgtx"
)

// Prefix starts the name of every partition of outbox_events.
const Prefix = "outbox_events_p"

// Bound returns the uuid that starts t's millisecond: the lowest UUIDv7 of
// that millisecond.
func Bound(t time.Time) uuid.UUID {
	var u uuid.UUID
	ms := uint64(t.UnixMilli())
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], ms)
	copy(u[:6], b[2:])
	return u
}

// TimeOf returns the time a UUIDv7's first 48 bits hold. For an id that is
// not a UUIDv7 it is whatever those bits read as.
func TimeOf(id uuid.UUID) time.Time {
	var b [8]byte
	copy(b[2:], id[:6])
	return time.UnixMilli(int64(binary.BigEndian.Uint64(b[:]))).UTC()
}

// Align returns the start of the interval that holds t.
func Align(t time.Time, interval time.Duration) time.Time {
	ms := interval.Milliseconds()
	return time.UnixMilli(t.UnixMilli() / ms * ms).UTC()
}

// Name returns the name of the partition starting at from.
func Name(from time.Time) string {
	return Prefix + from.UTC().Format("20060102t150405")
}

// Partition is one partition of outbox_events.
type Partition struct {
	// Name is the partition's table name.
	Name string
	// FromID and ToID are its bounds (FromID included, ToID not).
	FromID, ToID uuid.UUID
	// From and To are the bounds read as times.
	From, To time.Time
	// DetachPending is true while a DETACH ... CONCURRENTLY of it has not
	// finished (it was interrupted): FINALIZE completes it.
	DetachPending bool
	// Detached is true for a table an upkeep round detached and neither
	// dropped nor attached again (Leftovers): the next round does one or
	// the other.
	Detached bool
}

// Interval is the partition's width.
func (p Partition) Interval() time.Duration { return p.To.Sub(p.From) }

var boundRE = regexp.MustCompile(`FROM \('([0-9a-f-]{36})'\) TO \('([0-9a-f-]{36})'\)`)

// IsPartitioned reports whether schema s's outbox_events is a partitioned
// table. false, nil when the table does not exist.
func IsPartitioned(ctx context.Context, q pgtx.Querier, s pgident.Schema) (bool, error) {
	var kind string
	err := q.QueryRow(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')`,
		s.Table("outbox_events")).Scan(&kind)
	return kind == "p", err
}

// List returns the partitions of schema s's outbox_events, oldest first.
func List(ctx context.Context, q pgtx.Querier, s pgident.Schema) ([]Partition, error) {
	rows, err := q.Query(ctx, `SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)`, s.Table("outbox_events"))
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var p Partition
		var bound string
		if err := rows.Scan(&p.Name, &bound, &p.DetachPending); err != nil {
			return nil, err
		}
		m := boundRE.FindStringSubmatch(bound)
		if m == nil {
			return nil, fmt.Errorf("partition %s has bounds %q, not a range of event ids", p.Name, bound)
		}
		p.FromID, p.ToID = uuid.MustParse(m[1]), uuid.MustParse(m[2])
		p.From, p.To = TimeOf(p.FromID), TimeOf(p.ToID)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return string(out[i].FromID[:]) < string(out[j].FromID[:]) })
	return out, nil
}

// Interval returns the width of the newest partition, the width the next
// ones are made with; 0 when there is none.
func Interval(parts []Partition) time.Duration {
	if len(parts) == 0 {
		return 0
	}
	return parts[len(parts)-1].Interval()
}

// ErrNotOwner: creating, detaching and dropping partitions needs the
// table's owner (or a member of its role).
var ErrNotOwner = errors.New("the role does not own outbox_events")

// CanManage reports whether the session's role may create, detach and
// drop partitions of schema s's outbox_events: whether it is a member of
// the table's owner role.
func CanManage(ctx context.Context, q pgtx.Querier, s pgident.Schema) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $1::regclass`, s.Table("outbox_events")).Scan(&ok)
	return ok, err
}

// lockTimeout bounds how long one DDL statement of the upkeep waits for a
// lock: a statement waiting for a lock holds every later request for the
// table behind it in PostgreSQL's lock queue (writers included), so it
// gives up, and the next round tries again.
const lockTimeout = "5s"

// Create creates the partition [from, to) of schema s's outbox_events, in
// q's transaction, as a table of its own (the parent's columns, defaults
// and CHECK constraints, and the storage parameters opts, as
// pg_class.reloptions prints them) and attaches it. ATTACH PARTITION takes
// a SHARE UPDATE EXCLUSIVE lock on the parent, which writers, claims and
// marks do not conflict with; CREATE TABLE ... PARTITION OF would take an
// ACCESS EXCLUSIVE lock on it, and wait behind (and hold behind it) every
// transaction reading the outbox. The new table is empty: the attach has
// nothing to scan.
//
// A partition is named after its start (Name) unless a relation or type of
// that name is in the schema (a table a role with CREATE on the schema
// made): then the name gets a random suffix, rather than the creation
// failing every round until the partitions ahead run out. Nothing reads a
// partition's range from its name.
func Create(ctx context.Context, q pgtx.Querier, s pgident.Schema, from, to time.Time, opts string) (string, error) {
	name := Name(from)
	var taken bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL OR to_regtype($1) IS NOT NULL`, s.Table(name)).Scan(&taken); err != nil {
		return "", fmt.Errorf("create partition %s: %w", name, err)
	}
	if taken {
		name = fmt.Sprintf("%s_%08x", name, rand.Uint32())
	}
	parent := s.Table("outbox_events")
	t := s.Table(name)
	with := ""
	if opts != "" {
		with = " WITH (" + opts + ")"
	}
	if _, err := q.Exec(ctx, `CREATE TABLE `+t+` (LIKE `+parent+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)`+with); err != nil {
		return "", fmt.Errorf("create partition %s: %w", name, err)
	}
	// The roles that read the parent may read the partition's own table:
	// status reads a partition whose detach is unfinished there, as the
	// parent no longer shows its events.
	grants, err := q.Query(ctx, `SELECT format('GRANT SELECT ON %s TO %s', $2::text,
	CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END)
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = $1::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner`, parent, t)
	if err != nil {
		return "", fmt.Errorf("read the grants of %s: %w", parent, err)
	}
	var stmts []string
	for grants.Next() {
		var g string
		if err := grants.Scan(&g); err != nil {
			_ = grants.Close()
			return "", err
		}
		stmts = append(stmts, g)
	}
	if err := grants.Close(); err != nil {
		return "", fmt.Errorf("read the grants of %s: %w", parent, err)
	}
	for _, g := range stmts {
		if _, err := q.Exec(ctx, g); err != nil {
			return "", fmt.Errorf("grant on partition %s: %w", name, err)
		}
	}
	if _, err := q.Exec(ctx, `ALTER TABLE `+parent+` ATTACH PARTITION `+t+` FOR VALUES FROM ('`+Bound(from).String()+`') TO ('`+Bound(to).String()+`')`); err != nil {
		return "", fmt.Errorf("attach partition %s: %w", name, err)
	}
	return name, nil
}

// Options returns the storage parameters of schema s's table, as
// pg_class.reloptions prints them, joined by commas.
func Options(ctx context.Context, q pgtx.Querier, s pgident.Schema, table string) (string, error) {
	var opts string
	err := q.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ', '), '') FROM pg_class WHERE oid = $1::regclass`, s.Table(table)).Scan(&opts)
	if err != nil {
		return "", fmt.Errorf("read the storage parameters of %s: %w", table, err)
	}
	return opts, nil
}

// EnsureAhead creates, in one transaction, the partitions that are missing
// for the ids of [now - interval, now + ahead intervals) (EnsureAheadIn).
func EnsureAhead(ctx context.Context, db pgtx.DB, s pgident.Schema, now time.Time, ahead int) ([]string, error) {
	var made []string
	err := db.BeginFunc(ctx, pgtx.TxOptions{}, func(tx pgtx.Querier) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+lockTimeout+`'`); err != nil {
			return err
		}
		var err error
		made, err = EnsureAheadIn(ctx, tx, s, now, ahead, 0, "")
		return err
	})
	if err != nil {
		return nil, err
	}
	return made, nil
}

// EnsureAheadIn is EnsureAhead in q's transaction. The partitions are
// interval wide and carry the storage parameters opts; when interval is
// zero, they are as wide as the newest one and carry its parameters. They follow the newest one, or start at the
// interval before now's when the newest ends earlier than that (the gap
// stays: ids that old are refused).
func EnsureAheadIn(ctx context.Context, q pgtx.Querier, s pgident.Schema, now time.Time, ahead int, interval time.Duration, opts string) ([]string, error) {
	parts, err := List(ctx, q, s)
	if err != nil {
		return nil, err
	}
	start := time.Time{}
	if len(parts) > 0 {
		newest := parts[len(parts)-1]
		start = newest.To
		if interval <= 0 {
			interval = newest.Interval()
			if opts, err = Options(ctx, q, s, newest.Name); err != nil {
				return nil, err
			}
		}
	}
	if interval <= 0 {
		return nil, errors.New("outbox_events has no partition to take the interval from: convert it with outboxmigrate.Partition")
	}
	if first := Align(now, interval).Add(-interval); start.Before(first) {
		start = first
	}
	until := Align(now, interval).Add(time.Duration(ahead+1) * interval)
	var made []string
	for from := start; from.Before(until); from = from.Add(interval) {
		name, err := Create(ctx, q, s, from, from.Add(interval), opts)
		if err != nil {
			return made, err
		}
		made = append(made, name)
	}
	return made, nil
}

// IsNoPartition reports whether err is PostgreSQL's refusal of a row whose
// partition key falls in no partition (SQLSTATE 23514, check_violation,
// with no constraint named: "no partition of relation ... found for row"),
// or in a partition the upkeep closed before dropping it (23514 naming
// ClosedName).
func IsNoPartition(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		return false
	}
	return pgErr.ConstraintName == ClosedName ||
		pgErr.ConstraintName == "" && len(pgErr.Message) > 24 && pgErr.Message[:24] == "no partition of relation"
}
