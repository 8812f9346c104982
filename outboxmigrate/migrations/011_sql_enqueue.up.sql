-- outbox 011: the SQL door for writers, and the only door for the writer
-- role (docs/sql-api.md is the reference; the names, arguments, results and
-- SQLSTATEs below are API, versioned with these migrations).
--
--   enqueue(aggregate_type, aggregate_id, event_type, payload bytea|text,
--           content_type, headers, traceparent, schema_version, id)
--     RETURNS TABLE (event_id uuid, sequence bigint, occurred_at timestamptz)
--   enqueue_many(events jsonb) RETURNS the same, one row per event, in order
--   wake() wakes the relays (pg_notify on their channel); call it after commit
--   cleanup_events(older_than interval, batch int) RETURNS bigint
--   replay_finished(operation_id, replayed, aggregates, outcome)
--
-- The write functions validate like outbox.Event.validate (event_check.go),
-- allocate the aggregate's sequence under its counter-row lock like
-- Writer.InsertTx (they are what Writer.InsertTx runs), keep the
-- transaction-local outbox.wrote setting so that several calls in one
-- transaction lock counter rows in one global order, and write rows a
-- relay cannot tell from any other: occurred_at = available_at = now() (or
-- available_at = infinity behind a parked lane), dispatch_xid the
-- transaction's id, payload in payload_bytes.
--
-- They are SECURITY DEFINER, so that a writer role with EXECUTE on them and
-- no right on the tables can write events but cannot set a counter, park a
-- lane or insert a row already published or quarantined. Their search_path
-- is pinned to this schema with pg_temp last (pg_catalog is searched first),
-- so no object a caller creates can stand in for one they use. EXECUTE is
-- revoked from PUBLIC; outboxmigrate.Grants gives it to the roles.
--
-- Upgrading: functions only; no table is touched.

-- Pin the functions' search_path: this schema, then pg_temp (searched last,
-- never first as it would be by default for tables). SET ... FROM CURRENT
-- below stores this value in each function.
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

-- The helpers below have no SET clause: only the SECURITY DEFINER functions,
-- whose search_path is pinned, call them (EXECUTE is revoked from PUBLIC).

-- enqueue_check raises the error of the first rule event i breaks, in the
-- order Event.validate checks them, or returns the payload's text (NULL for
-- a non-JSON content type). SQLSTATE 22023 (invalid_parameter_value); the
-- message is Go's ("invalid event 0: aggregate id is empty"), and the error's
-- COLUMN field names the argument.
CREATE OR REPLACE FUNCTION enqueue_check(
    i integer, aggregate_type text, aggregate_id text, event_type text,
    schema_version integer, content_type text, payload bytea, headers jsonb, max_payload integer)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    problem text;
    field text;
    is_json boolean := true;
    t text;
    k text;
    v jsonb;
    n integer;
BEGIN
    -- aggregate type, aggregate id, event type: checkText
    SELECT c.problem, c.field INTO problem, field FROM (VALUES
        (1, 'aggregate type', 'aggregate_type', enqueue_check.aggregate_type, 255),
        (2, 'aggregate id', 'aggregate_id', enqueue_check.aggregate_id, 512),
        (3, 'event type', 'event_type', enqueue_check.event_type, 255)) AS f(ord, name, arg, val, max)
    CROSS JOIN LATERAL (SELECT CASE
        WHEN f.val IS NULL OR f.val = '' THEN f.name || ' is empty'
        WHEN octet_length(f.val) > f.max THEN format('%s is %s bytes, over the %s-byte limit', f.name, octet_length(f.val), f.max)
        WHEN f.val ~ '[\x01-\x1f\x7f]' THEN format('%s has a control character (U+%s) at byte %s', f.name,
            upper(lpad(to_hex(ascii(substring(f.val FROM '[\x01-\x1f\x7f]'))), 4, '0')),
            octet_length(substring(f.val FOR strpos(f.val, substring(f.val FROM '[\x01-\x1f\x7f]')) - 1)))
        END AS problem, f.arg AS field) c
    WHERE c.problem IS NOT NULL ORDER BY f.ord LIMIT 1;
    IF problem IS NULL AND schema_version < 0 THEN
        problem := format('schema version %s is negative', schema_version);
        field := 'schema_version';
    END IF;
    IF problem IS NULL AND octet_length(payload) > max_payload THEN
        problem := format('payload is %s bytes, over the %s-byte limit', octet_length(payload), max_payload);
        field := 'payload';
    END IF;
    IF problem IS NULL AND content_type IS NOT NULL AND content_type <> '' THEN
        problem := content_type_problem(content_type);
        field := 'content_type';
        IF problem IS NULL THEN
            is_json := lower(btrim(split_part(content_type, ';', 1), ' ')) ~ '^(application/json|.*\+json)$';
        END IF;
    END IF;
    IF problem IS NULL AND is_json THEN
        field := 'payload';
        IF payload IS NULL OR octet_length(payload) = 0 THEN
            problem := 'payload is empty (use {} or null for no data)';
        ELSE
            problem := json_problem(payload);
        END IF;
    END IF;
    IF problem IS NULL AND headers IS NOT NULL AND headers <> '{}'::jsonb THEN
        field := 'headers';
        IF jsonb_typeof(headers) <> 'object' THEN
            problem := 'headers is not a JSON object';
        ELSIF (SELECT count(*) FROM jsonb_object_keys(headers)) > 64 THEN
            problem := format('%s headers, over the limit of 64', (SELECT count(*) FROM jsonb_object_keys(headers)));
        ELSE
            FOR k, v IN SELECT * FROM jsonb_each(headers) LOOP
                IF jsonb_typeof(v) <> 'string' THEN
                    problem := format('header %s: value is not a string', k);
                ELSE
                    problem := header_problem(k, v #>> '{}');
                END IF;
                EXIT WHEN problem IS NOT NULL;
            END LOOP;
        END IF;
    END IF;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = field,
            MESSAGE = format('invalid event %s: %s', i, problem);
    END IF;
END
$fn$;

-- content_type_problem: checkContentType. Go's mime.ParseMediaType
-- accepts "type", "type/subtype" (tokens), then "; name=value" parameters
-- whose value is a token or a quoted string, white space around them, one
-- trailing ";", and a name given twice only with the same value.
CREATE OR REPLACE FUNCTION content_type_problem(ct text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    tok CONSTANT text := '[!#$%&''*+.^_`|~0-9A-Za-z-]+';
    rest text;
    m text[];
    name text;
    val text;
    seen jsonb := '{}';
BEGIN
    IF octet_length(ct) > 255 THEN
        RETURN format('content type is %s bytes, over the 255-byte limit', octet_length(ct));
    END IF;
    IF ct ~ '[^\x20-\x7e]' THEN
        RETURN format('content type %s is not printable ASCII', to_json(ct));
    END IF;
    IF btrim(split_part(ct, ';', 1), ' ') !~ ('^' || tok || '(/' || tok || ')?$') THEN
        RETURN format('content type %s: not a media type', to_json(ct));
    END IF;
    rest := substr(ct, length(split_part(ct, ';', 1)) + 1);
    LOOP
        rest := ltrim(rest, ' ');
        EXIT WHEN rest = '' OR rest ~ '^; *$';
        m := regexp_match(rest, '^; *(' || tok || ') *= *(' || tok || '|"(?:[^"\\]|\\.)*")(.*)$');
        IF m IS NULL THEN
            RETURN format('content type %s: mime: invalid media parameter', to_json(ct));
        END IF;
        name := lower(m[1]);
        val := m[2];
        IF left(val, 1) = '"' THEN
            val := regexp_replace(substr(val, 2, length(val) - 2), '\\([()<>@,;:\\"/\[\]?=])', '\1', 'g');
        END IF;
        IF seen ? name AND seen ->> name <> val THEN
            RETURN format('content type %s: mime: duplicate parameter name', to_json(ct));
        END IF;
        seen := seen || jsonb_build_object(name, val);
        rest := m[3];
    END LOOP;
    RETURN NULL;
END
$fn$;

-- json_depth_exceeds: whether the JSON text t nests arrays and objects
-- deeper than max (brackets inside strings do not count). Called only for
-- a payload with more than max opening brackets.
CREATE OR REPLACE FUNCTION json_depth_exceeds(t text, max integer) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    b text := regexp_replace(regexp_replace(t, '"(\\.|[^"\\])*"', '', 'g'), '[^][{}]', '', 'g');
    depth integer := 0;
    c text;
BEGIN
    FOREACH c IN ARRAY regexp_split_to_array(b, '') LOOP
        IF c = '[' OR c = '{' THEN
            depth := depth + 1;
            IF depth > max THEN
                RETURN true;
            END IF;
        ELSE
            depth := depth - 1;
        END IF;
    END LOOP;
    RETURN false;
END
$fn$;

-- json_problem: checkJSON. One JSON document (the json type's parser, which
-- checks syntax only), valid UTF-8, and no escape jsonb cannot hold: \u0000
-- or a surrogate not part of a pair.
CREATE OR REPLACE FUNCTION json_problem(payload bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    t text;
    pos integer := 1;
    esc text;
    r integer;
    lo integer;
BEGIN
    IF position('\x00'::bytea IN payload) > 0 THEN
        RETURN 'payload: not valid JSON';
    END IF;
    -- One block (one subtransaction): t stays NULL when the bytes are not
    -- UTF-8.
    BEGIN
        t := convert_from(payload, 'UTF8');
        -- Go's encoding/json refuses nesting deeper than 10,000; PostgreSQL's
        -- parser accepts more, up to its stack depth limit (then 54001).
        -- Only a payload with more than 10,000 brackets can be that deep:
        -- its brackets outside strings are counted then.
        IF octet_length(t) - octet_length(translate(t, '[{', '')) > 10000
           AND json_depth_exceeds(t, 10000) THEN
            RETURN 'payload: not valid JSON';
        END IF;
        PERFORM t::json;
    EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character
                OR invalid_text_representation OR invalid_parameter_value
                OR statement_too_complex THEN
        IF t IS NULL THEN
            RETURN 'payload: not valid UTF-8';
        END IF;
        RETURN 'payload: not valid JSON';
    END;
    IF strpos(t, '\u') = 0 THEN
        RETURN NULL;
    END IF;
    -- Walk the escapes left to right (t is valid JSON: every backslash is
    -- in a string and starts a well-formed escape).
    LOOP
        r := strpos(substr(t, pos), '\');
        EXIT WHEN r = 0;
        pos := pos + r - 1;
        esc := substr(t, pos + 1, 1);
        IF esc <> 'u' THEN
            pos := pos + 2;
            CONTINUE;
        END IF;
        r := ('x' || lpad(substr(t, pos + 2, 4), 8, '0'))::bit(32)::integer;
        IF r = 0 THEN
            RETURN format('payload: \u0000 at byte %s (PostgreSQL cannot store it)', octet_length(substr(t, 1, pos - 1)));
        ELSIF r BETWEEN 55296 AND 56319 THEN -- D800-DBFF
            IF substr(t, pos + 6, 2) <> '\u' OR substr(t, pos + 8, 4) !~ '^[0-9a-fA-F]{4}$' THEN
                RETURN format('payload: unpaired surrogate \u%s at byte %s', upper(substr(t, pos + 2, 4)), octet_length(substr(t, 1, pos - 1)));
            END IF;
            lo := ('x' || lpad(substr(t, pos + 8, 4), 8, '0'))::bit(32)::integer;
            IF lo NOT BETWEEN 56320 AND 57343 THEN
                RETURN format('payload: unpaired surrogate \u%s at byte %s', upper(substr(t, pos + 2, 4)), octet_length(substr(t, 1, pos - 1)));
            END IF;
            pos := pos + 12;
        ELSIF r BETWEEN 56320 AND 57343 THEN -- DC00-DFFF
            RETURN format('payload: unpaired surrogate \u%s at byte %s', upper(substr(t, pos + 2, 4)), octet_length(substr(t, 1, pos - 1)));
        ELSE
            pos := pos + 6;
        END IF;
    END LOOP;
    RETURN NULL;
END
$fn$;

-- header_problem: checkHeader.
CREATE OR REPLACE FUNCTION header_problem(k text, v text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $fn$
SELECT CASE
    WHEN k = '' THEN 'header with an empty name'
    WHEN octet_length(k) > 255 THEN format('header name is %s bytes, over the 255-byte limit', octet_length(k))
    WHEN k !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN format('header name %s: a byte is not allowed in a header name', to_json(k))
    WHEN lower(k) ~ '^(ce-|ce_|nats-|webhook-|cloudevents:)' THEN format('header name %s is reserved (set by the destinations)', to_json(k))
    WHEN lower(k) IN ('content-type', 'idempotency-key') THEN format('header name %s is reserved (set by the destinations)', to_json(k))
    WHEN octet_length(v) > 4096 THEN format('header %s: value is %s bytes, over the 4096-byte limit', k, octet_length(v))
    WHEN v ~ '^[ \t\n\v\f\r\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]'
      OR v ~ '[ \t\n\v\f\r\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]$'
        THEN format('header %s: value has leading or trailing white space', k)
    WHEN v ~ '[\x01-\x1f\x7f]' THEN format('header %s: value has a control character', k)
END
$fn$;

-- enqueue_hold records the aggregates (keys, a jsonb array of
-- schema U+001F type U+001F id) a call is about to lock in outbox.wrote, or
-- raises 55000 (object_not_in_prerequisite_state) when the transaction
-- already holds an aggregate sorting after one of them that it does not
-- hold: two transactions doing so in opposite orders would deadlock. It
-- raises before anything is locked or written.
CREATE OR REPLACE FUNCTION enqueue_hold(keys jsonb) RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    w jsonb := nullif(current_setting('outbox.wrote', true), '')::jsonb;
    bad text;
BEGIN
    IF w IS NULL THEN
        PERFORM set_config('outbox.wrote', keys::text, true);
        RETURN;
    END IF;
    SELECT k INTO bad FROM jsonb_array_elements_text(keys) k
    WHERE NOT jsonb_exists(w, k)
      AND (split_part(k, chr(31), 1), split_part(k, chr(31), 2), split_part(k, chr(31), 3)) < (
        SELECT split_part(h, chr(31), 1), split_part(h, chr(31), 2), split_part(h, chr(31), 3)
        FROM jsonb_array_elements_text(w) h ORDER BY split_part(h, chr(31), 1) DESC, split_part(h, chr(31), 2) DESC, split_part(h, chr(31), 3) DESC LIMIT 1)
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('a further enqueue in a transaction must not write to an aggregate that sorts before one it already wrote to (%s/%s)',
                split_part(bad, chr(31), 2), split_part(bad, chr(31), 3)),
            HINT = 'Write all of a transaction''s events in one call (enqueue_many), or in order of aggregate type, then id.';
    END IF;
    PERFORM set_config('outbox.wrote', (w || (SELECT coalesce(jsonb_agg(k), '[]') FROM jsonb_array_elements_text(keys) k
        WHERE NOT jsonb_exists(w, k)))::text, true);
END
$fn$;

-- with_traceparent adds the traceparent header unless headers has one (in
-- any spelling) or it would take the event over 64 headers; a traceparent
-- that is not W3C's format is refused (22023).
CREATE OR REPLACE FUNCTION with_traceparent(i integer, headers jsonb, traceparent text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF traceparent IS NULL OR traceparent = '' THEN
        RETURN headers;
    END IF;
    IF traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'traceparent',
            MESSAGE = format('invalid event %s: traceparent %s is not a W3C traceparent', i, to_json(traceparent));
    END IF;
    IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        RETURN jsonb_build_object('traceparent', traceparent);
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_object_keys(headers) k WHERE lower(k) = 'traceparent')
       OR (SELECT count(*) FROM jsonb_object_keys(headers)) >= 64 THEN
        RETURN headers;
    END IF;
    RETURN headers || jsonb_build_object('traceparent', traceparent);
END
$fn$;

-- new_event_id: a UUIDv7 (RFC 9562: 48 bits of Unix milliseconds, version
-- 7, variant 10, random bits), like the ids Writer assigns, so that an
-- event's id tells its time to whoever reads it (inbox.Config.StartAtFirstSeen).
CREATE OR REPLACE FUNCTION new_event_id() RETURNS uuid
LANGUAGE sql VOLATILE
AS $fn$
SELECT encode(set_byte(set_byte(overlay(r
        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 6, (get_byte(r, 6) & 15) | 112), 8, (get_byte(r, 8) & 63) | 128), 'hex')::uuid
FROM (SELECT uuid_send(gen_random_uuid()) AS r) g
$fn$;

CREATE OR REPLACE FUNCTION enqueue(
    aggregate_type text, aggregate_id text, event_type text, payload bytea,
    content_type text DEFAULT NULL, headers jsonb DEFAULT NULL, traceparent text DEFAULT NULL,
    schema_version integer DEFAULT 1, id uuid DEFAULT NULL)
RETURNS TABLE (event_id uuid, sequence bigint, occurred_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT
SET outbox.max_payload_bytes = '1048576'
AS $fn$
#variable_conflict use_column
DECLARE
    h jsonb;
    eid uuid := coalesce(enqueue.id, new_event_id());
    seq bigint;
    parked timestamptz;
BEGIN
    h := with_traceparent(0, enqueue.headers, enqueue.traceparent);
    PERFORM enqueue_check(0, enqueue.aggregate_type, enqueue.aggregate_id, enqueue.event_type,
        coalesce(enqueue.schema_version, 1), enqueue.content_type, enqueue.payload, h,
        current_setting('outbox.max_payload_bytes')::integer);
    PERFORM enqueue_hold(jsonb_build_array(current_schema() || chr(31) || enqueue.aggregate_type || chr(31) || enqueue.aggregate_id));
    INSERT INTO outbox_aggregates AS a (aggregate_type, aggregate_id, last_sequence)
    VALUES (enqueue.aggregate_type, enqueue.aggregate_id, 1)
    ON CONFLICT (aggregate_type, aggregate_id)
    DO UPDATE SET last_sequence = a.last_sequence + 1,
        parked_through = CASE WHEN a.parked_through = a.last_sequence THEN a.last_sequence + 1 ELSE a.parked_through END
    RETURNING a.last_sequence, a.parked_at INTO seq, parked;
    RETURN QUERY
    INSERT INTO outbox_events AS e (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type,
        schema_version, payload_bytes, headers, content_type, available_at)
    VALUES (eid, enqueue.aggregate_type, enqueue.aggregate_id, seq, enqueue.event_type,
        CASE WHEN coalesce(enqueue.schema_version, 0) = 0 THEN 1 ELSE enqueue.schema_version END,
        coalesce(enqueue.payload, ''::bytea), coalesce(h, '{}'::jsonb),
        CASE WHEN enqueue.content_type = '' OR enqueue.content_type = 'application/json' THEN NULL ELSE enqueue.content_type END,
        CASE WHEN parked IS NULL THEN now() ELSE 'infinity'::timestamptz END)
    RETURNING e.event_id, e.aggregate_sequence, e.occurred_at;
END
$fn$;

-- The text form: the payload's UTF-8 bytes (what a driver sends for a
-- string; a quoted literal picks this form).
CREATE OR REPLACE FUNCTION enqueue(
    aggregate_type text, aggregate_id text, event_type text, payload text,
    content_type text DEFAULT NULL, headers jsonb DEFAULT NULL, traceparent text DEFAULT NULL,
    schema_version integer DEFAULT 1, id uuid DEFAULT NULL)
RETURNS TABLE (event_id uuid, sequence bigint, occurred_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT
AS $fn$
SELECT * FROM enqueue($1, $2, $3, convert_to($4, 'UTF8'), $5, $6, $7, $8, $9)
$fn$;

-- enqueue_many: events is a JSON array of objects with the arguments of
-- enqueue as keys; the payload is "payload_base64" (exact bytes) or
-- "payload" (a JSON value, stored as PostgreSQL writes it). Validated
-- first, all of them; then the counter rows are locked in one statement,
-- in order of aggregate type, then id. Rows come back in the events' order.
-- STRICT: a NULL array enqueues nothing and returns no row.
CREATE OR REPLACE FUNCTION enqueue_many(events jsonb)
RETURNS TABLE (event_id uuid, sequence bigint, occurred_at timestamptz)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER
SET search_path FROM CURRENT
SET outbox.max_payload_bytes = '1048576'
AS $fn$
#variable_conflict use_column
DECLARE
    ev jsonb;
    i integer := 0;
    max_payload integer := current_setting('outbox.max_payload_bytes')::integer;
    input_rows jsonb := '[]';
    keys jsonb := '[]';
    held text;
    eid uuid;
    ids jsonb := '{}';
    h jsonb;
    p bytea;
BEGIN
    IF jsonb_typeof(events) <> 'array' OR jsonb_array_length(events) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'events',
            MESSAGE = 'invalid event: no events given (events must be a non-empty JSON array)';
    END IF;
    FOR ev IN SELECT value FROM jsonb_array_elements(events) LOOP
        IF jsonb_typeof(ev) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'events',
                MESSAGE = format('invalid event %s: not a JSON object', i);
        END IF;
        IF ev ? 'payload_base64' THEN
            p := decode(ev ->> 'payload_base64', 'base64');
        ELSIF ev ? 'payload' AND jsonb_typeof(ev -> 'payload') IS NOT NULL THEN
            p := convert_to((ev -> 'payload')::text, 'UTF8');
        ELSE
            p := NULL;
        END IF;
        h := with_traceparent(i, nullif(ev -> 'headers', 'null'::jsonb), ev ->> 'traceparent');
        PERFORM enqueue_check(i, ev ->> 'aggregate_type', ev ->> 'aggregate_id', ev ->> 'event_type',
            coalesce((ev ->> 'schema_version')::integer, 1), ev ->> 'content_type', p, h, max_payload);
        eid := coalesce((ev ->> 'event_id')::uuid, new_event_id());
        IF ids ? eid::text THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'event_id',
                MESSAGE = format('invalid event %s: event id %s given twice', i, eid);
        END IF;
        ids := ids || jsonb_build_object(eid::text, true);
        held := current_schema() || chr(31) || (ev ->> 'aggregate_type') || chr(31) || (ev ->> 'aggregate_id');
        IF NOT keys ? held THEN
            keys := keys || to_jsonb(held);
        END IF;
        input_rows := input_rows || jsonb_build_object('ord', i, 'event_id', eid,
            'aggregate_type', ev ->> 'aggregate_type', 'aggregate_id', ev ->> 'aggregate_id',
            'event_type', ev ->> 'event_type',
            'schema_version', CASE WHEN coalesce((ev ->> 'schema_version')::integer, 0) = 0 THEN 1 ELSE (ev ->> 'schema_version')::integer END,
            'content_type', CASE WHEN ev ->> 'content_type' IN ('', 'application/json') THEN NULL ELSE ev ->> 'content_type' END,
            'payload', encode(p, 'base64'), 'headers', coalesce(h, '{}'::jsonb));
        i := i + 1;
    END LOOP;
    PERFORM enqueue_hold(keys);
    RETURN QUERY
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(input_rows) AS r(
            ord int, event_id uuid, aggregate_type text, aggregate_id text,
            event_type text, schema_version int, content_type text, payload text, headers jsonb)
    ), counts AS (
        SELECT aggregate_type, aggregate_id, count(*) AS n
        FROM input GROUP BY aggregate_type, aggregate_id
    ), seq AS (
        INSERT INTO outbox_aggregates AS a (aggregate_type, aggregate_id, last_sequence)
        SELECT aggregate_type, aggregate_id, n FROM counts
        ORDER BY aggregate_type, aggregate_id
        ON CONFLICT (aggregate_type, aggregate_id)
        DO UPDATE SET last_sequence = a.last_sequence + EXCLUDED.last_sequence,
            parked_through = CASE WHEN a.parked_through = a.last_sequence THEN a.last_sequence + EXCLUDED.last_sequence ELSE a.parked_through END
        RETURNING a.aggregate_type, a.aggregate_id, a.last_sequence, a.parked_at
    ), ins AS (
        INSERT INTO outbox_events AS e (event_id, aggregate_type, aggregate_id,
            aggregate_sequence, event_type, schema_version, content_type, payload_bytes, headers, available_at)
        SELECT i.event_id, i.aggregate_type, i.aggregate_id,
            s.last_sequence - c.n + row_number() OVER (PARTITION BY i.aggregate_type, i.aggregate_id ORDER BY i.ord),
            i.event_type, i.schema_version, i.content_type, decode(coalesce(i.payload, ''), 'base64'), i.headers,
            CASE WHEN s.parked_at IS NULL THEN now() ELSE 'infinity'::timestamptz END
        FROM input i
        JOIN counts c USING (aggregate_type, aggregate_id)
        JOIN seq s USING (aggregate_type, aggregate_id)
        ORDER BY i.ord -- rows stored in the events' order, as ids (UUIDv7) grow: the planner's correlation
        RETURNING e.event_id, e.aggregate_sequence, e.occurred_at
    )
    SELECT ins.event_id, ins.aggregate_sequence, ins.occurred_at
    FROM ins JOIN input USING (event_id) ORDER BY input.ord;
END
$fn$;

-- wake: pg_notify on the channel the relays of this schema listen on
-- (outbox.NotifyChannel): "outbox_events_" and the schema name, or, past
-- 63 bytes, its first bytes and 16 hex digits of its SHA-256. Call it after
-- commit, outside the writing transaction (a NOTIFY inside it takes a
-- database-wide lock at commit). Optional: relays poll anyway.
CREATE OR REPLACE FUNCTION wake() RETURNS void
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $fn$
SELECT pg_notify(CASE WHEN octet_length('outbox_events_' || current_schema()) <= 63
    THEN 'outbox_events_' || current_schema()
    ELSE 'outbox_events_' || left(current_schema(), 63 - 14 - 1 - 16) || '_'
        || left(encode(sha256(convert_to(current_schema(), 'UTF8')), 'hex'), 16) END, '')
$fn$;

-- cleanup_events deletes up to batch settled events published longer than
-- older_than ago (the clean-up's statement, cleanup.go), and returns how
-- many. It is the only way the relay and operator roles delete events: they
-- have no DELETE on outbox_events, so no unpublished event can be deleted
-- but by the tables' owner.
CREATE OR REPLACE FUNCTION cleanup_events(older_than interval, batch integer) RETURNS bigint
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
SET search_path FROM CURRENT
AS $fn$
WITH gone AS (
    DELETE FROM outbox_events WHERE ctid = ANY (ARRAY(
        SELECT e.ctid FROM outbox_events e
        WHERE e.published_at IS NOT NULL AND e.published_at < now() - older_than
          AND (e.skipped_at IS NULL OR (
            (SELECT a.last_sequence FROM outbox_aggregates a
             WHERE a.aggregate_type = e.aggregate_type AND a.aggregate_id = e.aggregate_id) > e.aggregate_sequence
            AND NOT EXISTS (SELECT 1 FROM outbox_events n
                WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id
                  AND n.aggregate_sequence = e.aggregate_sequence + 1)))
        ORDER BY e.published_at
        LIMIT batch
        FOR UPDATE SKIP LOCKED))
    RETURNING 1)
SELECT count(*) FROM gone
$fn$;

-- replay_finished records a replay's outcome in its own audit row, once:
-- the operator role inserts audit rows but may not update or delete them.
CREATE OR REPLACE FUNCTION replay_finished(operation_id bigint, replayed bigint, aggregates bigint, outcome text) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT
AS $fn$
WITH done AS (
    UPDATE outbox_operations o
    SET detail = o.detail || jsonb_build_object('replayed', replayed, 'aggregates', aggregates, 'finished_at', now(), 'outcome', outcome)
    WHERE o.operation_id = replay_finished.operation_id AND o.action = 'replay' AND NOT (o.detail ? 'finished_at')
    RETURNING 1)
SELECT EXISTS (SELECT 1 FROM done)
$fn$;

REVOKE ALL ON FUNCTION enqueue_check(integer, text, text, text, integer, text, bytea, jsonb, integer),
    content_type_problem(text), json_problem(bytea), json_depth_exceeds(text, integer), new_event_id(), header_problem(text, text), enqueue_hold(jsonb),
    with_traceparent(integer, jsonb, text),
    enqueue(text, text, text, bytea, text, jsonb, text, integer, uuid),
    enqueue(text, text, text, text, text, jsonb, text, integer, uuid),
    enqueue_many(jsonb), wake(), cleanup_events(interval, integer),
    replay_finished(bigint, bigint, bigint, text)
    FROM PUBLIC;

SELECT set_config('search_path', format('%I', current_schema()), true);
