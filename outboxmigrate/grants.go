package outboxmigrate

// Least privilege: the SQL that gives each of the outbox's three kinds of
// database user (the application that writes events, the relay, the
// operator's CLI) only the rights its statements need. Every grant below is
// derived from the SQL of the code named in its comment; change them
// together.

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/outbox/internal/pgident"
)

// Default role names of Roles.
const (
	WriterRoleDefault   = "outbox_writer"
	RelayRoleDefault    = "outbox_relay"
	OperatorRoleDefault = "outbox_operator"
)

// Roles names the PostgreSQL roles Grants gives rights to. Each name is
// letters, digits and underscores, at most 63 bytes.
type Roles struct {
	// Writer is the application's role: Writer.InsertTx, Writer.InsertSQLTx,
	// Writer.Notify and Notifier. Defaults to WriterRoleDefault.
	Writer string
	// Relay is the relay's role: Relay.Run with its heartbeats, lane
	// parking and, when configured, clean-up. Defaults to RelayRoleDefault.
	Relay string
	// Operator is the role of the admin commands: outbox status,
	// quarantine, replay, cleanup and inbox status|resolve (Admin and
	// inbox.Admin). Defaults to OperatorRoleDefault.
	Operator string
}

func (r Roles) withDefaults() Roles {
	if r.Writer == "" {
		r.Writer = WriterRoleDefault
	}
	if r.Relay == "" {
		r.Relay = RelayRoleDefault
	}
	if r.Operator == "" {
		r.Operator = OperatorRoleDefault
	}
	return r
}

// grant is one GRANT: privileges on a table of the schema ("" for the
// schema itself), and why.
type grant struct {
	privileges, table, why string
}

// writerGrants: the counter upsert (INSERT ... ON CONFLICT DO UPDATE ...
// RETURNING reads and writes outbox_aggregates) and the event INSERT, whose
// RETURNING reads three columns. pg_notify needs no right. The writer can
// read no payload and change no event.
var writerGrants = []grant{
	{"SELECT, INSERT, UPDATE", "outbox_aggregates", "per-aggregate sequence counter (upsert ... RETURNING)"},
	{"INSERT", "outbox_events", "the events"},
	{"SELECT (event_id, aggregate_sequence, occurred_at)", "outbox_events", "the INSERT's RETURNING"},
}

// relayGrants: claim (SELECT ... FOR UPDATE SKIP LOCKED feeding UPDATE ...
// RETURNING), marks, failures, releases, lane parking and the lane sweep,
// heartbeats (upsert, prune, delete), the schema version check at start,
// and the clean-up (DELETE through SELECT ... FOR UPDATE, which needs an
// UPDATE right on some column: processed_events gets it on processed_at
// only, which the clean-up never writes).
var relayGrants = []grant{
	{"SELECT, UPDATE, DELETE", "outbox_events", "claim, settle, park; DELETE for the clean-up"},
	{"SELECT, UPDATE", "outbox_aggregates", "lane parking and the lane sweep"},
	{"SELECT, INSERT, UPDATE, DELETE", "outbox_relays", "heartbeats"},
	{"SELECT", "outbox_schema_migrations", "the schema version check at start"},
	{"SELECT, DELETE", "processed_events", "the inbox clean-up (RelayConfig.Cleanup.InboxOlderThan)"},
	{"UPDATE (processed_at)", "processed_events", "the clean-up's row locks (FOR UPDATE)"},
}

// operatorGrants: Admin.Status and Gauges, ListQuarantined, Event, Retry
// and Skip (they unpark the lane and write the audit log), Replay (reads
// events, writes and updates its audit row), Cleanup, and inbox.Admin's
// Waiting, Aggregate and Resolve (the mark upsert, the audit log), and
// sideeffect.Admin's Status, Gauges, Parked and Resolve.
var operatorGrants = []grant{
	{"SELECT, UPDATE, DELETE", "outbox_events", "status, quarantine retry|skip, replay, cleanup"},
	{"SELECT, UPDATE", "outbox_aggregates", "unparking a lane on retry|skip; cleanup"},
	{"SELECT", "outbox_relays", "status"},
	{"SELECT", "outbox_schema_migrations", "status and the schema version check"},
	{"SELECT, INSERT, UPDATE", "outbox_operations", "the audit log (replay updates its own row)"},
	{"SELECT, DELETE", "processed_events", "cleanup --inbox-older-than"},
	{"UPDATE (processed_at)", "processed_events", "the clean-up's row locks (FOR UPDATE)"},
	{"SELECT, INSERT, UPDATE", "inbox_aggregates", "inbox status|resolve"},
	{"SELECT, UPDATE", "side_effects", "status (side effects) and sideeffect.Admin.Resolve"},
}

// Grants returns SQL that grants the roles the rights they need on the
// outbox tables of schema (pgident.DefaultSchema when empty), and no more:
//
//   - the writer inserts events and bumps their aggregate's counter; it
//     cannot read payloads, change events or read the audit log;
//   - the relay claims, settles and parks events, keeps its heartbeat row
//     and runs the clean-up when configured; it cannot insert events or
//     touch the audit log, the inbox marks or any other table;
//   - the operator reads everything the status shows, retries, skips,
//     replays, cleans up and resolves inbox waits, writing the audit log;
//     it cannot insert events.
//
// The roles must exist (the script carries commented CREATE ROLE lines for
// NOLOGIN group roles). Run the script as the tables' owner (the role that
// ran Migrate) after Migrate; it is idempotent. Ownership stays with the
// owner, who alone can migrate, and, before PostgreSQL 17, VACUUM: the
// relay's own vacuum (which runs only while autovacuum is off for
// outbox_events) is then skipped by PostgreSQL with a warning; on 17 and
// later the commented GRANT MAINTAIN line lets the relay run it.
func Grants(schema string, roles Roles) (string, error) {
	s, err := pgident.NewSchema(schema)
	if err != nil {
		return "", err
	}
	roles = roles.withDefaults()
	for _, r := range []struct{ what, name string }{{"writer", roles.Writer}, {"relay", roles.Relay}, {"operator", roles.Operator}} {
		if err := pgident.ValidateSchema(r.name); err != nil {
			return "", fmt.Errorf("outboxmigrate: %s role %q: use letters, digits and underscores (at most 63 bytes)", r.what, r.name)
		}
	}
	q := func(role string) string { return pgx.Identifier{role}.Sanitize() }
	var b strings.Builder
	fmt.Fprintf(&b, `-- outbox grants for schema %s: least privilege for three roles.
-- Run as the owner of the outbox tables, after 'outbox migrate'. Idempotent.
-- The roles must exist; for example, as group roles your login users join:
--   CREATE ROLE %s NOLOGIN;
--   CREATE ROLE %s NOLOGIN;
--   CREATE ROLE %s NOLOGIN;
--   GRANT %s TO your_app_user;
BEGIN;
`, s.Name(), q(roles.Writer), q(roles.Relay), q(roles.Operator), q(roles.Writer))
	write := func(title, role string, gs []grant) {
		fmt.Fprintf(&b, "\n-- %s\nGRANT USAGE ON SCHEMA %s TO %s;\n", title, s.Quoted(), q(role))
		for _, g := range gs {
			fmt.Fprintf(&b, "GRANT %s ON %s TO %s; -- %s\n", g.privileges, s.Table(g.table), q(role), g.why)
		}
	}
	write("writer (the application): Writer.InsertTx, Writer.Notify, Notifier", roles.Writer, writerGrants)
	write("relay: Relay.Run; LISTEN and pg_notify need no right", roles.Relay, relayGrants)
	fmt.Fprintf(&b, "-- VACUUM needs the owner before PostgreSQL 17 (the relay vacuums only while autovacuum is off); on 17+:\n--   GRANT MAINTAIN ON %s, %s TO %s;\n",
		s.Table("outbox_events"), s.Table("outbox_aggregates"), q(roles.Relay))
	write("operator: outbox status, quarantine, replay, cleanup, inbox status|resolve", roles.Operator, operatorGrants)
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}
