package outboxcdc

// Slot status: what `outbox status` and the relay's metrics show about the
// CDC relay groups' slots.

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// SlotStatus describes one relay group's replication slot.
type SlotStatus struct {
	// Slot is the slot's name.
	Slot string `json:"slot"`
	// Active reports whether a relay streams the slot now.
	Active bool `json:"active"`
	// WALStatus is pg_replication_slots.wal_status: reserved or extended
	// (fine), unreserved (past max_wal_size: it will be lost at a
	// checkpoint unless the relay catches up), lost (invalidated; a CDC
	// relay recreates it).
	WALStatus string `json:"wal_status"`
	// SafeWALBytes is how much more WAL can be written before the slot is
	// lost (pg_replication_slots.safe_wal_size); nil when
	// max_slot_wal_keep_size is unlimited.
	SafeWALBytes *int64 `json:"safe_wal_bytes,omitempty"`
	// LagBytes is the WAL written since the slot's confirmed position: how
	// far behind the CDC relay is.
	LagBytes int64 `json:"lag_bytes"`
	// RetainedBytes is the WAL the slot keeps on disk (since its
	// restart_lsn).
	RetainedBytes int64 `json:"retained_bytes"`
	// RedecodeBytes is the WAL between the slot's restart_lsn and its
	// confirmed position: what PostgreSQL decodes again, before it sends
	// anything new, each time a relay starts streaming the slot (a
	// restart, a takeover by a standby, a reconnection). The oldest
	// transaction that has written WAL and was still open at the confirmed
	// position holds restart_lsn back: a long one (a migration, a batch job,
	// a session left idle in transaction after a write) makes every
	// takeover slower by the time it takes to decode this much.
	RedecodeBytes int64 `json:"redecode_bytes"`
	// LagSeconds is the streaming relay's flush lag as PostgreSQL measures
	// it (pg_stat_replication.flush_lag: the time between a WAL position
	// being written and the relay confirming it); nil when no relay
	// streams, or when PostgreSQL has no recent measurement (idle).
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
}

// Slots returns the status of the CDC slots of schema: the logical slots
// of this database named with the default prefix ("outbox_<schema>_", see
// SlotName). Slots named otherwise (Config.Slot) are not listed.
func Slots(ctx context.Context, pool *pgxpool.Pool, schema string) ([]SlotStatus, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return nil, err
	}
	prefix := identifier("outbox_" + s.Name() + "_")
	like := strings.NewReplacer(`\`, `\\`, `_`, `\_`, `%`, `\%`).Replace(prefix) + "%"
	rows, err := pool.Query(ctx, `SELECT s.slot_name, s.active, coalesce(s.wal_status, ''), s.safe_wal_size,
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint,
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint,
		greatest(coalesce(pg_wal_lsn_diff(s.confirmed_flush_lsn, s.restart_lsn), 0), 0)::bigint,
		extract(epoch FROM r.flush_lag)::float8
	FROM pg_replication_slots s
	LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
	WHERE s.slot_type = 'logical' AND s.database = current_database() AND s.slot_name LIKE $1
	ORDER BY s.slot_name`, like)
	if err != nil {
		return nil, fmt.Errorf("outboxcdc: read replication slots: %w", err)
	}
	defer rows.Close()
	var out []SlotStatus
	for rows.Next() {
		var st SlotStatus
		if err := rows.Scan(&st.Slot, &st.Active, &st.WALStatus, &st.SafeWALBytes, &st.LagBytes, &st.RetainedBytes, &st.RedecodeBytes, &st.LagSeconds); err != nil {
			return nil, fmt.Errorf("outboxcdc: read replication slots: %w", err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxcdc: read replication slots: %w", err)
	}
	return out, nil
}
