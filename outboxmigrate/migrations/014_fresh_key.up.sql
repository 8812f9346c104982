-- outbox 014: the incremental claim's cursor keeps its place inside a
-- transaction.
--
-- The incremental claim (migration 009) reads the pending events as written
-- from a cursor, oldest transaction first, a window of rows at a time. Its
-- cursor was a transaction id: it could not move past a transaction it had
-- not read to its end. One transaction that wrote more events than the
-- window, none of them the head of its lane (a bulk write behind a
-- quarantined event whose lane nothing had parked yet), filled every
-- window, and every event written after it waited for the relay's periodic
-- full scan. The cursor is now a transaction id and an event id, and the
-- range scan reads in that order: outbox_fresh_key_idx replaces
-- outbox_fresh_idx, with event_id as its second column.
--
-- Its predicate states "neither published nor quarantined" as
-- coalesce(published_at, quarantined_at) IS NULL, a form no other index's
-- predicate is implied by: the relay's statements that read this index
-- state it in that form, and then no other partial index of pending events
-- (all of which say published_at IS NULL) is usable for them. A first
-- version of this index kept migration 009's form, and under a transaction
-- holding the xmin the planner read the relay's range from
-- outbox_pending_lane_idx whole, a filter and a sort over every dead entry,
-- at every claim (claims of seconds). docs/design.md, "Claiming only what
-- is new", has the argument.
--
-- For the same reason outbox_due_idx replaces outbox_rescheduled_idx (the
-- scheduled events: backed off, released, retried, unparked), with the same
-- form of its predicate, which the claim's scan of due events states; under
-- migration 009's form an index of every pending event could serve that
-- scan too (outbox_dispatch_idx, ordered by available_at as well).
--
-- Upgrading a large table: CREATE INDEX reads the pending events only
-- (the index is partial) but blocks writes while it does. On a big
-- outbox_events, create outbox_fresh_key_idx first with CREATE INDEX
-- CONCURRENTLY (same name and definition, outside a transaction); this file
-- then finds it, and only drops the old index. A relay of an earlier
-- version keeps working, more slowly: its statements do not state the new
-- predicate's form, so they read another index of pending events; upgrade
-- the relays with the schema.
-- A CREATE INDEX CONCURRENTLY that failed (cancelled, or a deadlock) leaves
-- an invalid index of its name, which IF NOT EXISTS would keep and no query
-- uses: it is dropped and built again; so is one of that name whose
-- definition is not this file's, as PostgreSQL prints it (the relay's
-- statements might not be able to use it). The schema is found by its name
-- as it is, capitals included.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE c.relname = 'outbox_fresh_key_idx' AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
                 AND (NOT i.indisvalid OR substring(pg_get_indexdef(i.indexrelid) FROM ' USING .*$') <>
                      ' USING btree (dispatch_xid, event_id) WHERE ((COALESCE(published_at, quarantined_at) IS NULL) AND (dispatch_xid IS NOT NULL) AND (available_at = occurred_at))')) THEN
        DROP INDEX outbox_fresh_key_idx;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE c.relname = 'outbox_due_idx' AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
                 AND (NOT i.indisvalid OR substring(pg_get_indexdef(i.indexrelid) FROM ' USING .*$') <>
                      ' USING btree (available_at) WHERE ((COALESCE(published_at, quarantined_at) IS NULL) AND (available_at <> occurred_at) AND (available_at < ''infinity''::timestamp with time zone))')) THEN
        DROP INDEX outbox_due_idx;
    END IF;
END $$;

CREATE INDEX IF NOT EXISTS outbox_fresh_key_idx
    ON outbox_events (dispatch_xid, event_id)
    WHERE coalesce(published_at, quarantined_at) IS NULL AND dispatch_xid IS NOT NULL
      AND available_at = occurred_at;

DROP INDEX IF EXISTS outbox_fresh_idx;

CREATE INDEX IF NOT EXISTS outbox_due_idx
    ON outbox_events (available_at)
    WHERE coalesce(published_at, quarantined_at) IS NULL AND available_at <> occurred_at
      AND available_at < 'infinity';

DROP INDEX IF EXISTS outbox_rescheduled_idx;
