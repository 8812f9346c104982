-- outbox 013: the SQL write API (migration 011) refuses and assigns as the
-- Go Writer does, in the cases an adversarial review found apart
-- (docs/sql-api.md):
--
--   - a content type with "{" or "}" in a token is accepted (Go's mime
--     package counts them as token characters; Writer.InsertTx passed such
--     an event to enqueue, whose refusal aborted the caller's transaction);
--   - a nil UUID given as the id (enqueue's id, enqueue_many's event_id) is
--     "no id", as a zero Event.ID is: a UUIDv7 is assigned (every such event
--     used to share the nil id);
--   - headers that are not a JSON object are refused with a traceparent
--     too (with_traceparent replaced them by {"traceparent": ...});
--   - a traceparent W3C Trace Context calls invalid (version ff, an
--     all-zero trace id or parent id) is refused, as one of another shape
--     always was;
--   - enqueue_many refuses a schema_version that is not an integer from 0
--     to 2147483647 and an event_id that is not a UUID with SQLSTATE 22023
--     and COLUMN, as documented, instead of PostgreSQL's cast errors.
--
-- And it makes the functions a service calls with a text payload and no
-- id as fast as the Go Writer's call (new_event_id and the text form of
-- enqueue become PL/pgSQL, whose plans a session keeps).
--
-- Upgrading: functions only (CREATE OR REPLACE keeps their owner and
-- grants); no table is touched.

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

-- A payload limit the owner raised on the bytea form of enqueue or on
-- enqueue_many (docs/sql-api.md: ALTER FUNCTION ... SET
-- outbox.max_payload_bytes) is a SET clause, which CREATE OR REPLACE
-- replaces: keep each one here and set it again at the end (the bytea
-- form's on the text form too, which now has a limit of its own).
SELECT set_config('outbox.migrate_limit_one', coalesce((SELECT split_part(c, '=', 2)
        FROM pg_proc p, unnest(p.proconfig) c
        WHERE p.oid = 'enqueue(text, text, text, bytea, text, jsonb, text, integer, uuid)'::regprocedure
          AND c LIKE 'outbox.max\_payload\_bytes=%'), '1048576'), true),
    set_config('outbox.migrate_limit_many', coalesce((SELECT split_part(c, '=', 2)
        FROM pg_proc p, unnest(p.proconfig) c
        WHERE p.oid = 'enqueue_many(jsonb)'::regprocedure
          AND c LIKE 'outbox.max\_payload\_bytes=%'), '1048576'), true);

CREATE OR REPLACE FUNCTION content_type_problem(ct text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    tok CONSTANT text := '[!#$%&''*+.^_`{|}~0-9A-Za-z-]+';
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

-- with_traceparent adds the traceparent header unless headers has one (in
-- any spelling) or it would take the event over 64 headers. Headers that
-- are not an object are returned as they are, for enqueue_check to refuse.
-- A traceparent is refused (22023) unless consumers' propagators read it
-- (W3C Trace Context, as OpenTelemetry's reads it): version 00 with flags
-- 00 to 02 and nothing after, or a later version (01 to fe) with any flags
-- and, after a "-", more fields; a trace id and a parent id not all zeros.
CREATE OR REPLACE FUNCTION with_traceparent(i integer, headers jsonb, traceparent text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF traceparent IS NULL OR traceparent = '' THEN
        RETURN headers;
    END IF;
    IF NOT (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-0[0-2]$'
            OR (traceparent ~ '^([0-9a-e][0-9a-f]|f[0-9a-e])-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'
                AND left(traceparent, 2) <> '00'))
       OR substr(traceparent, 4, 32) = repeat('0', 32)
       OR substr(traceparent, 37, 16) = repeat('0', 16) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'traceparent',
            MESSAGE = format('invalid event %s: traceparent %s is not a valid W3C traceparent', i, to_json(traceparent));
    END IF;
    IF headers IS NULL THEN
        RETURN jsonb_build_object('traceparent', traceparent);
    END IF;
    IF jsonb_typeof(headers) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_object_keys(headers) k WHERE lower(k) = 'traceparent')
       OR (SELECT count(*) FROM jsonb_object_keys(headers)) >= 64 THEN
        RETURN headers;
    END IF;
    RETURN headers || jsonb_build_object('traceparent', traceparent);
END
$fn$;

-- new_event_id as in migration 011 (a UUIDv7), in PL/pgSQL: as a SQL
-- function with a FROM clause it could not be inlined, and PostgreSQL
-- planned its body again in every transaction that called enqueue without
-- an id, some 80 µs of each (the Go Writer passes its own id).
CREATE OR REPLACE FUNCTION new_event_id() RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    r bytea := uuid_send(gen_random_uuid());
BEGIN
    RETURN encode(set_byte(set_byte(overlay(r
        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 6, (get_byte(r, 6) & 15) | 112), 8, (get_byte(r, 8) & 63) | 128), 'hex')::uuid;
END
$fn$;

-- event_id_or_new: the id given, or a new UUIDv7 when none is (NULL or the
-- nil UUID, as a zero Event.ID is for Writer).
CREATE OR REPLACE FUNCTION event_id_or_new(id uuid) RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF id IS NULL OR id = '00000000-0000-0000-0000-000000000000'::uuid THEN
        RETURN new_event_id();
    END IF;
    RETURN id;
END
$fn$;

-- many_schema_version: enqueue_many's schema_version of event i (absent or
-- null: 1), refused with 22023 unless a whole number (1, 1.0, 1e3) up to
-- 2147483647 (a negative one is enqueue_check's to refuse, as for enqueue).
CREATE OR REPLACE FUNCTION many_schema_version(i integer, v jsonb) RETURNS integer
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN 1;
    END IF;
    IF jsonb_typeof(v) <> 'number' OR v::numeric <> trunc(v::numeric) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'schema_version',
            MESSAGE = format('invalid event %s: schema version %s is not an integer', i, v::text);
    END IF;
    IF v::numeric > 2147483647 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'schema_version',
            MESSAGE = format('invalid event %s: schema version %s is over 2147483647', i, v::text);
    END IF;
    IF v::numeric < 0 THEN
        RETURN -1; -- enqueue_check refuses it as negative, as for enqueue
    END IF;
    RETURN v::numeric::integer;
END
$fn$;

-- many_event_id: enqueue_many's event_id of event i (absent, null or the
-- nil UUID: a new one), refused with 22023 unless a JSON string holding a
-- UUID as PostgreSQL reads one (32 hex digits, a "-" allowed after any
-- group of four, braces around all of it or none).
CREATE OR REPLACE FUNCTION many_event_id(i integer, v jsonb) RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN new_event_id();
    END IF;
    IF jsonb_typeof(v) <> 'string'
       OR v #>> '{}' !~* '^([0-9a-f]{4}(-?[0-9a-f]{4}){7}|\{[0-9a-f]{4}(-?[0-9a-f]{4}){7}\})$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'event_id',
            MESSAGE = format('invalid event %s: event id %s is not a UUID', i, v::text);
    END IF;
    RETURN event_id_or_new((v #>> '{}')::uuid);
END
$fn$;

-- enqueue and enqueue_many as in migration 011, with the id and the
-- enqueue_many arguments above. Both forms of enqueue call one body
-- (enqueue_one): the text form was a SQL function around the bytea one,
-- never inlined (it has SET clauses), whose statement PostgreSQL planned
-- again in every transaction, and whose SET clauses were paid twice (a
-- service calling enqueue with a text payload, as most drivers send a
-- string, wrote 0.72x to 0.81x the transactions per second of the Go
-- Writer, which calls the bytea form).
-- many_payload: enqueue_many's payload_base64 of event i, refused with
-- 22023 unless a JSON string of base64 as PostgreSQL decodes it (padded;
-- white space ignored).
CREATE OR REPLACE FUNCTION many_payload(i integer, v jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF jsonb_typeof(v) <> 'string'
       OR regexp_replace(v #>> '{}', '[ \t\r\n]', '', 'g')
          !~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'payload_base64',
            MESSAGE = format('invalid event %s: payload_base64 is not base64', i);
    END IF;
    RETURN decode(v #>> '{}', 'base64');
END
$fn$;

-- enqueue_one is enqueue's body, for both forms: it runs with their
-- search_path and payload limit. Not SECURITY DEFINER itself, and revoked
-- from PUBLIC: only they call it.
CREATE OR REPLACE FUNCTION enqueue_one(
    aggregate_type text, aggregate_id text, event_type text, payload bytea,
    content_type text, headers jsonb, traceparent text, schema_version integer, id uuid)
RETURNS TABLE (event_id uuid, sequence bigint, occurred_at timestamptz)
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    h jsonb;
    eid uuid := event_id_or_new(enqueue_one.id);
    seq bigint;
    parked timestamptz;
BEGIN
    h := with_traceparent(0, enqueue_one.headers, enqueue_one.traceparent);
    PERFORM enqueue_check(0, enqueue_one.aggregate_type, enqueue_one.aggregate_id, enqueue_one.event_type,
        coalesce(enqueue_one.schema_version, 1), enqueue_one.content_type, enqueue_one.payload, h,
        current_setting('outbox.max_payload_bytes')::integer);
    PERFORM enqueue_hold(jsonb_build_array(current_schema() || chr(31) || enqueue_one.aggregate_type || chr(31) || enqueue_one.aggregate_id));
    INSERT INTO outbox_aggregates AS a (aggregate_type, aggregate_id, last_sequence)
    VALUES (enqueue_one.aggregate_type, enqueue_one.aggregate_id, 1)
    ON CONFLICT (aggregate_type, aggregate_id)
    DO UPDATE SET last_sequence = a.last_sequence + 1,
        parked_through = CASE WHEN a.parked_through = a.last_sequence THEN a.last_sequence + 1 ELSE a.parked_through END
    RETURNING a.last_sequence, a.parked_at INTO seq, parked;
    RETURN QUERY
    INSERT INTO outbox_events AS e (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type,
        schema_version, payload_bytes, headers, content_type, available_at)
    VALUES (eid, enqueue_one.aggregate_type, enqueue_one.aggregate_id, seq, enqueue_one.event_type,
        CASE WHEN coalesce(enqueue_one.schema_version, 0) = 0 THEN 1 ELSE enqueue_one.schema_version END,
        coalesce(enqueue_one.payload, ''::bytea), coalesce(h, '{}'::jsonb),
        CASE WHEN enqueue_one.content_type = '' OR enqueue_one.content_type = 'application/json' THEN NULL ELSE enqueue_one.content_type END,
        CASE WHEN parked IS NULL THEN now() ELSE 'infinity'::timestamptz END)
    RETURNING e.event_id, e.aggregate_sequence, e.occurred_at;
END
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
BEGIN
    RETURN QUERY SELECT * FROM enqueue_one($1, $2, $3, $4, $5, $6, $7, $8, $9);
END
$fn$;

-- The text form: the payload's UTF-8 bytes (what a driver sends for a
-- string; a quoted literal picks this form).
CREATE OR REPLACE FUNCTION enqueue(
    aggregate_type text, aggregate_id text, event_type text, payload text,
    content_type text DEFAULT NULL, headers jsonb DEFAULT NULL, traceparent text DEFAULT NULL,
    schema_version integer DEFAULT 1, id uuid DEFAULT NULL)
RETURNS TABLE (event_id uuid, sequence bigint, occurred_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT
SET outbox.max_payload_bytes = '1048576'
AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM enqueue_one($1, $2, $3, convert_to($4, 'UTF8'), $5, $6, $7, $8, $9);
END
$fn$;

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
    sv integer;
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
            p := many_payload(i, ev -> 'payload_base64');
        ELSIF ev ? 'payload' AND jsonb_typeof(ev -> 'payload') IS NOT NULL THEN
            p := convert_to((ev -> 'payload')::text, 'UTF8');
        ELSE
            p := NULL;
        END IF;
        h := with_traceparent(i, nullif(ev -> 'headers', 'null'::jsonb), ev ->> 'traceparent');
        sv := many_schema_version(i, ev -> 'schema_version');
        PERFORM enqueue_check(i, ev ->> 'aggregate_type', ev ->> 'aggregate_id', ev ->> 'event_type',
            sv, ev ->> 'content_type', p, h, max_payload);
        eid := many_event_id(i, ev -> 'event_id');
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
            'schema_version', CASE WHEN sv = 0 THEN 1 ELSE sv END,
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

REVOKE ALL ON FUNCTION many_payload(integer, jsonb), enqueue_one(text, text, text, bytea, text, jsonb, text, integer, uuid), event_id_or_new(uuid), many_schema_version(integer, jsonb), many_event_id(integer, jsonb) FROM PUBLIC;

-- The payload limits the owner had raised (kept at the start).
DO $do$
BEGIN
    IF current_setting('outbox.migrate_limit_one') <> '1048576' THEN
        -- The text form has a limit of its own now (it called the bytea
        -- form before, whose limit applied): the same.
        EXECUTE format('ALTER FUNCTION enqueue(text, text, text, bytea, text, jsonb, text, integer, uuid) SET outbox.max_payload_bytes = %L',
            current_setting('outbox.migrate_limit_one'));
        EXECUTE format('ALTER FUNCTION enqueue(text, text, text, text, text, jsonb, text, integer, uuid) SET outbox.max_payload_bytes = %L',
            current_setting('outbox.migrate_limit_one'));
    END IF;
    IF current_setting('outbox.migrate_limit_many') <> '1048576' THEN
        EXECUTE format('ALTER FUNCTION enqueue_many(jsonb) SET outbox.max_payload_bytes = %L',
            current_setting('outbox.migrate_limit_many'));
    END IF;
END
$do$;

SELECT set_config('search_path', format('%I', current_schema()), true);
