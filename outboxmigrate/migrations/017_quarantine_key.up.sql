-- outbox 017: the statements that look for quarantined events read an index
-- of quarantined events only.
--
-- migration 002's outbox_quarantined_idx says "quarantined, not published"
-- as quarantined_at IS NOT NULL AND published_at IS NULL. A statement that
-- states it so may also be served by any index of pending events (they all
-- say published_at IS NULL), and the planner picks among them by cost, on
-- statistics that know nothing of dead index entries. Under a transaction
-- holding the xmin, the relay's lane sweep (once a minute) was planned as a
-- walk of outbox_pending_lane_idx whole, with quarantined_at as a filter:
-- every entry of every event published since the xmin was pinned, 413,071
-- buffers and 3.6 s after nine minutes in the pressure bench, growing with
-- the pin, to find no row (BENCHMARKS.md, "Under pressure", stop 36).
--
-- outbox_quarantine_key_idx replaces it, with the same key and its
-- predicate in a form no index of pending events is implied by:
-- num_nonnulls(quarantined_at) > num_nonnulls(published_at), "quarantined
-- and not published". The statements that look for quarantined events (the
-- lane sweep, `outbox quarantine list` and its count, status's count of
-- events blocked behind a quarantine) state it in that form, so for them
-- this index and a scan of the whole table are the only paths. The same
-- device as migration 014's: docs/design.md, "A predicate only the claim
-- states".
--
-- Upgrading: CREATE INDEX reads the whole table (the index is partial, and
-- holds only the few quarantined events) and blocks writes while it does.
-- On a big outbox_events, create it first with CREATE INDEX CONCURRENTLY
-- (same name and definition, outside a transaction); this file then finds
-- it, and only drops the old index. Relays and CLIs of an earlier version
-- keep working: their statements cannot use the new index and read another
-- index of pending events, as they did before. A relay of this version on a
-- schema not yet migrated reads the table whole for these statements (at
-- most once a minute for the sweep): migrate first.
-- A CREATE INDEX CONCURRENTLY that failed leaves an invalid index of its
-- name, which IF NOT EXISTS would keep and no query uses: it is dropped and
-- built again, as is one of that name whose definition is not this file's.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE c.relname = 'outbox_quarantine_key_idx' AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
                 AND (NOT i.indisvalid OR substring(pg_get_indexdef(i.indexrelid) FROM ' USING .*$') <>
                      ' USING btree (quarantined_at) WHERE (num_nonnulls(quarantined_at) > num_nonnulls(published_at))')) THEN
        DROP INDEX outbox_quarantine_key_idx;
    END IF;
END $$;

CREATE INDEX IF NOT EXISTS outbox_quarantine_key_idx
    ON outbox_events (quarantined_at)
    WHERE num_nonnulls(quarantined_at) > num_nonnulls(published_at);

DROP INDEX IF EXISTS outbox_quarantined_idx;
