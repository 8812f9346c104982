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
	ConsumerRoleDefault = "outbox_consumer"
)

// Roles names the PostgreSQL roles Grants gives rights to. Each name is
// letters, digits and underscores, at most 63 bytes.
type Roles struct {
	// Writer is the application's role: Writer.InsertTx, Writer.InsertSQLTx,
	// Writer.Notify, Notifier, and the SQL write API (enqueue, enqueue_many,
	// wake) from any language. Defaults to WriterRoleDefault.
	Writer string
	// Relay is the relay's role: Relay.Run with its heartbeats, lane
	// parking and, when configured, clean-up. Defaults to RelayRoleDefault.
	Relay string
	// Operator is the role of the admin commands: outbox status,
	// quarantine, replay, cleanup and inbox status|resolve (Admin and
	// inbox.Admin). Defaults to OperatorRoleDefault.
	Operator string
	// Consumer is the role of a consumer's inbox (inbox.Inbox: Handle,
	// Seed, StartPoint), which also needs the rights on the consumer's own
	// business tables, granted by you. Defaults to ConsumerRoleDefault.
	Consumer string
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
	if r.Consumer == "" {
		r.Consumer = ConsumerRoleDefault
	}
	return r
}

// grant is one GRANT: privileges on an object of the schema (a table, or
// "FUNCTION name(argument types)"), and why.
type grant struct {
	privileges, object, why string
}

// writerGrants: nothing on the tables. The writer writes events only
// through the SECURITY DEFINER functions of migration 011, which validate
// the event, take the next sequence of its aggregate and insert a row that
// is due (or parked behind a quarantined event), never published or
// quarantined. So a writer cannot set any aggregate's counter (lowering it
// would make every later write to the aggregate fail, raising it would
// leave consumers waiting on a gap forever), park or unpark a lane, forge
// an event's state or last_error, or read any event. pg_notify (wake,
// Writer.Notify) needs no right.
var writerGrants = []grant{
	{"EXECUTE", "FUNCTION enqueue(text, text, text, bytea, text, jsonb, text, integer, uuid)", "write one event (Writer.InsertTx)"},
	{"EXECUTE", "FUNCTION enqueue(text, text, text, text, text, jsonb, text, integer, uuid)", "write one event, payload as text"},
	{"EXECUTE", "FUNCTION enqueue_many(jsonb)", "write several events (Writer.InsertTx)"},
	{"EXECUTE", "FUNCTION wake()", "wake the relays after commit"},
}

// relayEventColumns are the columns of outbox_events the relay's
// statements write (relay_sql.go's claim, mark, fail and release, the
// incremental claims of relay_cursor.go and relay_claim_ids.go, the
// route probes of relay_route.go, the lane parking of parked.go): the
// claim, the outcome and when the event is due. Not the payload, the
// headers, the event's identity or its sequence, nor its skip record.
const relayEventColumns = "claimed_by, claim_token, claim_until, published_at, available_at, attempt_count, last_error, quarantined_at"

// relayGrants: claim (SELECT ... FOR UPDATE SKIP LOCKED feeding UPDATE ...
// RETURNING), marks, failures, releases, lane parking and the lane sweep,
// heartbeats (upsert, prune, delete), the schema version check at start,
// and the clean-up: events only through cleanup_events, which deletes
// nothing unpublished; inbox rows by DELETE through SELECT ... FOR UPDATE,
// which needs an UPDATE right on some column: processed_events gets it on
// processed_at only, which the clean-up never writes. With --metrics-addr
// the relay also reads the inbox marks for the inbox gauges; without that
// read every scrape failed (an ERROR in PostgreSQL's log each time).
var relayGrants = []grant{
	{"SELECT", "outbox_events", "claim, settle, park"},
	{"UPDATE (" + relayEventColumns + ")", "outbox_events", "the claim, its outcome, when the event is due"},
	{"SELECT", "outbox_aggregates", "lane parking and the lane sweep"},
	{"UPDATE (parked_at, parked_through)", "outbox_aggregates", "park and unpark lanes; never the counter"},
	{"SELECT, INSERT, UPDATE, DELETE", "outbox_relays", "heartbeats"},
	{"SELECT", "outbox_schema_migrations", "the schema version check at start"},
	{"EXECUTE", "FUNCTION cleanup_events(interval, integer)", "the clean-up of published events (RelayConfig.Cleanup)"},
	{"SELECT, DELETE", "processed_events", "the inbox clean-up (RelayConfig.Cleanup.InboxOlderThan)"},
	{"UPDATE (processed_at)", "processed_events", "the clean-up's row locks (FOR UPDATE)"},
	{"SELECT", "inbox_aggregates", "the inbox gauges of --metrics-addr (inbox.Admin.Gauges)"},
}

// operatorEventColumns are the columns of outbox_events that quarantine
// retry and skip write (admin.go): the quarantine, the claim, the skip
// record. Not the payload, the headers, the identity or the sequence.
const operatorEventColumns = "quarantined_at, attempt_count, available_at, claimed_by, claim_token, claim_until, " +
	"published_at, skipped_at, skipped_by, skip_reason, skipped_from"

// operatorGrants: Admin.Status and Gauges, ListQuarantined, Event, Retry
// and Skip (they unpark the lane and write the audit log), Replay (reads
// events, writes its audit row and records its outcome through
// replay_finished), Cleanup (cleanup_events), and inbox.Admin's Waiting,
// Aggregate and Resolve (the mark upsert, the audit log), and
// sideeffect.Admin's Status, Gauges, Parked and Resolve.
//
// The audit log is append-only for the operator: INSERT and SELECT, no
// UPDATE or DELETE, so what it records cannot be rewritten or removed but
// by the tables' owner; the one update the operator's commands make, a
// replay's outcome in its own row, goes through replay_finished, which
// writes it once and only on a replay row. And the operator deletes no
// event itself: cleanup_events deletes published events only, so an
// unpublished event cannot disappear. (A column grant cannot limit a
// DELETE, and a function that deleted unpublished events with an audit row
// would be a door no command needs.) Skip still marks an event published
// with column rights; the row records who and why (skipped_by,
// skip_reason, required together by a CHECK constraint), whatever the
// audit log says.
var operatorGrants = []grant{
	{"SELECT", "outbox_events", "status, quarantine list, replay"},
	{"UPDATE (" + operatorEventColumns + ")", "outbox_events", "quarantine retry|skip"},
	{"SELECT", "outbox_aggregates", "status, quarantine"},
	{"UPDATE (parked_at, parked_through)", "outbox_aggregates", "unparking a lane on retry|skip; never the counter"},
	{"SELECT", "outbox_relays", "status"},
	{"SELECT", "outbox_schema_migrations", "status and the schema version check"},
	{"SELECT, INSERT", "outbox_operations", "the audit log: append-only"},
	{"EXECUTE", "FUNCTION replay_finished(bigint, bigint, bigint, text)", "a replay records its outcome in its own audit row, once"},
	{"EXECUTE", "FUNCTION cleanup_events(interval, integer)", "cleanup: published events only"},
	{"SELECT, DELETE", "processed_events", "cleanup --inbox-older-than"},
	{"UPDATE (processed_at)", "processed_events", "the clean-up's row locks (FOR UPDATE)"},
	{"SELECT, INSERT, UPDATE", "inbox_aggregates", "inbox status|resolve"},
	{"SELECT, UPDATE", "side_effects", "status (side effects) and sideeffect.Admin.Resolve"},
	{"SELECT", "side_effect_waits", "the events waiting on an attempt (sideeffect show, sideeffect.Admin.Waiting)"},
}

// consumerGrants: inbox.Inbox's statements (inbox/inbox.go): the
// processed_events insert (ON CONFLICT DO NOTHING RETURNING a constant:
// INSERT alone), the per-aggregate mark (an upsert that locks the row,
// then updates it), and the consumer's start point (insert once, read);
// and the SQL inbox's functions (migration 012), which run with these same
// rights (SECURITY INVOKER); and package sideeffect's Caller: its
// attempts (a claim inserts or updates the row, a call not sent deletes
// the row it created) and the events waiting on one (WaitTx's upsert,
// Resume's lock, update and delete). Nothing on the outbox's own tables.
var consumerGrants = []grant{
	{"INSERT", "processed_events", "the applied event (Handle)"},
	{"SELECT, INSERT, UPDATE", "inbox_aggregates", "the consumer's per-aggregate mark (Handle, Seed)"},
	{"SELECT, INSERT", "inbox_consumers", "the start point (Config.StartAtFirstSeen, StartPoint)"},
	{"EXECUTE", "FUNCTION inbox_claim(text, uuid, text, text, bigint, bigint, timestamptz, boolean, interval, text)", "the SQL inbox (any language): apply, duplicate or early"},
	{"EXECUTE", "FUNCTION inbox_seed(text, text, text, bigint, text)", "the SQL inbox's seed"},
	{"EXECUTE", "FUNCTION inbox_start_point(text)", "the start point, for inbox_claim's start_at_first_seen"},
	{"SELECT, INSERT, UPDATE, DELETE", "side_effects", "the consumer's external calls (sideeffect.Caller: Do, Reconcile)"},
	{"SELECT, INSERT, UPDATE, DELETE", "side_effect_waits", "events waiting on a parked call (Caller.WaitTx, Resume)"},
}

// Grants returns SQL that grants the roles the rights they need on the
// outbox tables and functions of schema (pgident.DefaultSchema when empty),
// and no more:
//
//   - the writer calls the write functions (enqueue, enqueue_many, wake)
//     and has no right on any table: it cannot set a counter, park a lane,
//     write an event already published or quarantined, read payloads,
//     change events or read the audit log;
//   - the relay claims, settles and parks events (UPDATE on the claim,
//     outcome and due-time columns only: never a payload or a sequence),
//     keeps its heartbeat row and runs the clean-up when configured
//     (published events only, through cleanup_events); it cannot insert
//     or delete an event, or touch the audit log, the inbox marks or any
//     other table;
//   - the operator reads everything the status shows, retries, skips,
//     replays, cleans up and resolves inbox waits, appending to the audit
//     log, which it cannot update or delete; it cannot insert events,
//     delete an unpublished one, or change a payload or a sequence;
//   - the consumer records what its inbox applied (processed_events,
//     inbox_aggregates, inbox_consumers) and its side effects
//     (side_effects, side_effect_waits), and nothing else of the outbox.
//
// The script first revokes every right the roles have on the schema's
// tables and functions, so that running it after an upgrade takes away
// what an older version granted (a writer's table rights, for one). The
// roles must exist (the script carries commented CREATE ROLE lines for
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
	all := []struct{ what, name string }{{"writer", roles.Writer}, {"relay", roles.Relay}, {"operator", roles.Operator}, {"consumer", roles.Consumer}}
	for _, r := range all {
		if err := pgident.ValidateSchema(r.name); err != nil {
			return "", fmt.Errorf("outboxmigrate: %s role %q: use letters, digits and underscores (at most 63 bytes)", r.what, r.name)
		}
	}
	q := func(role string) string { return pgx.Identifier{role}.Sanitize() }
	var b strings.Builder
	fmt.Fprintf(&b, `-- outbox grants for schema %s: least privilege for four roles.
-- Run as the owner of the outbox tables, after 'outbox migrate'. Idempotent.
-- The roles must exist; for example, as group roles your login users join:
--   CREATE ROLE %s NOLOGIN;
--   CREATE ROLE %s NOLOGIN;
--   CREATE ROLE %s NOLOGIN;
--   CREATE ROLE %s NOLOGIN;
--   GRANT %s TO your_app_user;
BEGIN;

-- What older versions granted goes first (a role named twice keeps both jobs' rights).
`, s.Name(), q(roles.Writer), q(roles.Relay), q(roles.Operator), q(roles.Consumer), q(roles.Writer))
	seen := map[string]bool{}
	for _, r := range all {
		if seen[r.name] {
			continue
		}
		seen[r.name] = true
		fmt.Fprintf(&b, "REVOKE ALL ON ALL TABLES IN SCHEMA %s FROM %s;\nREVOKE ALL ON ALL FUNCTIONS IN SCHEMA %s FROM %s;\n",
			s.Quoted(), q(r.name), s.Quoted(), q(r.name))
	}
	write := func(title, role string, gs []grant) {
		fmt.Fprintf(&b, "\n-- %s\nGRANT USAGE ON SCHEMA %s TO %s;\n", title, s.Quoted(), q(role))
		for _, g := range gs {
			on := s.Table(g.object)
			if fn, ok := strings.CutPrefix(g.object, "FUNCTION "); ok {
				on = "FUNCTION " + s.Quoted() + "." + fn
			}
			fmt.Fprintf(&b, "GRANT %s ON %s TO %s; -- %s\n", g.privileges, on, q(role), g.why)
		}
	}
	write("writer (the application): Writer.InsertTx, Writer.Notify, Notifier, the SQL write API; no table", roles.Writer, writerGrants)
	write("relay: Relay.Run; LISTEN and pg_notify need no right", roles.Relay, relayGrants)
	fmt.Fprintf(&b, "-- VACUUM needs the owner before PostgreSQL 17 (the relay vacuums only while autovacuum is off); on 17+:\n--   GRANT MAINTAIN ON %s, %s TO %s;\n",
		s.Table("outbox_events"), s.Table("outbox_aggregates"), q(roles.Relay))
	write("operator: outbox status, quarantine, replay, cleanup, inbox status|resolve", roles.Operator, operatorGrants)
	write("consumer: inbox.Inbox and the SQL inbox (grant its business tables yourself)", roles.Consumer, consumerGrants)
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}
