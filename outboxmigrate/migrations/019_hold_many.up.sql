-- outbox 019: a transaction's later enqueue calls cost what they write and
-- a pass over what the transaction holds, not the product of the two.
--
-- enqueue_hold (migration 011) looked each of a call's aggregates up in
-- outbox.wrote, a jsonb array of every aggregate the transaction holds, with
-- jsonb_exists: a scan of the array per aggregate, twice (the order check,
-- then the new setting). A transaction writing 200,000 events of as many
-- aggregates in calls of 1,000 made 200 calls of 1,000 scans of up to
-- 200,000 entries: over ten minutes, before the Go writer's own check
-- (outbox.Writer, the same lookups) doubled it.
--
-- Now the largest aggregate held (by schema, type, id, the order of the
-- check) is found once per call. An aggregate sorting after it is not held:
-- it is new, and in order. One sorting before it must be held already;
-- those alone are looked up, in a hash of the held array built once (a
-- hashed subplan: "NOT IN" over a subquery that does not depend on the row),
-- built only when one does (OFFSET 0 keeps the filters in that order).
-- The aggregate refused is the first in the call's order, as before.
--
-- The setting keeps its format (a jsonb array of schema U+001F type U+001F
-- id), so writers of either version and these functions read each other's.
--
-- Upgrading: a function only (CREATE OR REPLACE keeps its owner and
-- grants); no table is touched.

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

CREATE OR REPLACE FUNCTION enqueue_hold(keys jsonb) RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    w jsonb := nullif(current_setting('outbox.wrote', true), '')::jsonb;
    top_schema text;
    top_type text;
    top_id text;
    bad text;
BEGIN
    IF w IS NULL OR jsonb_array_length(w) = 0 THEN
        PERFORM set_config('outbox.wrote', keys::text, true);
        RETURN;
    END IF;
    SELECT split_part(h, chr(31), 1), split_part(h, chr(31), 2), split_part(h, chr(31), 3)
    INTO top_schema, top_type, top_id
    FROM jsonb_array_elements_text(w) h
    ORDER BY 1 DESC, 2 DESC, 3 DESC LIMIT 1;
    SELECT k INTO bad FROM (
        SELECT k FROM jsonb_array_elements_text(keys) k
        WHERE (split_part(k, chr(31), 1), split_part(k, chr(31), 2), split_part(k, chr(31), 3)) < (top_schema, top_type, top_id)
        OFFSET 0) before
    WHERE k NOT IN (SELECT jsonb_array_elements_text(w))
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('a further enqueue in a transaction must not write to an aggregate that sorts before one it already wrote to (%s/%s)',
                split_part(bad, chr(31), 2), split_part(bad, chr(31), 3)),
            HINT = 'Write all of a transaction''s events in one call (enqueue_many), or in order of aggregate type, then id.';
    END IF;
    PERFORM set_config('outbox.wrote', (w || (SELECT coalesce(jsonb_agg(k), '[]') FROM jsonb_array_elements_text(keys) k
        WHERE (split_part(k, chr(31), 1), split_part(k, chr(31), 2), split_part(k, chr(31), 3)) > (top_schema, top_type, top_id)))::text, true);
END
$fn$;

SELECT set_config('search_path', format('%I', current_schema()), true);
