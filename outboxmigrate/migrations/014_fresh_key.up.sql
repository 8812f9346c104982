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
-- outbox_fresh_idx, same predicate, with event_id as its second column.
-- docs/design.md, "Claiming only what is new", has the argument.
--
-- Upgrading a large table: CREATE INDEX reads the pending events only
-- (the index is partial) but blocks writes while it does. On a big
-- outbox_events, create outbox_fresh_key_idx first with CREATE INDEX
-- CONCURRENTLY (same name and definition, outside a transaction); this file
-- then finds it, and only drops the old index. A relay of an earlier
-- version keeps working on the new index (its range scan reads a prefix of
-- it), and a relay of this version on the old one, more slowly.
-- A CREATE INDEX CONCURRENTLY that failed (cancelled, or a deadlock) leaves
-- an invalid index of its name, which IF NOT EXISTS would keep and no query
-- uses: it is dropped and built again.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE c.relname = 'outbox_fresh_key_idx' AND c.relnamespace = current_schema()::regnamespace
                 AND NOT i.indisvalid) THEN
        DROP INDEX outbox_fresh_key_idx;
    END IF;
END $$;

CREATE INDEX IF NOT EXISTS outbox_fresh_key_idx
    ON outbox_events (dispatch_xid, event_id)
    WHERE published_at IS NULL AND quarantined_at IS NULL AND dispatch_xid IS NOT NULL
      AND available_at = occurred_at;

DROP INDEX IF EXISTS outbox_fresh_idx;
