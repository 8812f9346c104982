-- outbox 003: payloads published exactly as written, content types, and
-- limits that every destination can carry.
--
-- Everything here is a catalogue change: the new columns are nullable, the
-- NOT NULL dropped from payload only widens what a row may hold, and the
-- CHECK constraints are added NOT VALID (existing rows are not rescanned
-- under the ALTER's lock; new and updated rows are checked). Run
-- "ALTER TABLE outbox_events VALIDATE CONSTRAINT ..." later, online, to have
-- PostgreSQL check the old rows too.

-- payload_bytes holds the payload as the writer was given it, byte for byte:
-- JSON with its key order, whitespace and duplicate keys, or any other
-- encoding (protobuf, Avro) named by content_type. jsonb re-serialises a
-- document, so what reached the broker was not what was written (signed
-- payloads broke) and its size was not the size the writer checked.
--
-- payload (jsonb) stays for the rows written before this migration and for
-- writers in other languages that insert jsonb by hand: the relay publishes
-- payload_bytes when it is set, else payload's text. Exactly one of the two
-- is set.
ALTER TABLE outbox_events
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN IF NOT EXISTS payload_bytes bytea,
    ADD COLUMN IF NOT EXISTS content_type  text;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'outbox_events_payload_check' AND conrelid = 'outbox_events'::regclass) THEN
        ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_payload_check
            CHECK ((payload IS NULL) <> (payload_bytes IS NULL)) NOT VALID;
    END IF;
    -- NULL means application/json. A media type is short; 255 bytes is
    -- generous and fits every protocol's content-type field.
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'outbox_events_content_type_check' AND conrelid = 'outbox_events'::regclass) THEN
        ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_content_type_check
            CHECK (content_type IS NULL OR octet_length(content_type) BETWEEN 1 AND 255) NOT VALID;
    END IF;
    -- Every destination carries the aggregate id in a subject, a record key,
    -- a routing key or a header, and the aggregate type and event type in a
    -- subject token, a topic name or a header. An id of 1,500 bytes once made
    -- a NATS subject past the server's 4,096-byte control line, and the
    -- server closed the connection for every event. The writer refuses longer
    -- values (outbox.MaxAggregateIDBytes, MaxNameBytes); these checks hold
    -- rows written by other languages to the same limits.
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'outbox_events_key_length_check' AND conrelid = 'outbox_events'::regclass) THEN
        ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_key_length_check
            CHECK (octet_length(aggregate_id) <= 512
                   AND octet_length(aggregate_type) <= 255
                   AND octet_length(event_type) <= 255) NOT VALID;
    END IF;
END $$;
