-- outbox 008: a consumer's start point, recorded once.
--
-- inbox.Config.StartAtFirstSeen starts an aggregate at the first event a
-- consumer sees only when the aggregate's history began before the consumer
-- did: an aggregate created after it is applied from sequence 1, whatever
-- order its events are handled in (two workers, a redelivery). started_at is
-- that point, by this database's clock: set the first time the consumer
-- handles an event with StartAtFirstSeen (or calls Inbox.StartPoint), never
-- moved afterwards. An event that occurred before it (occurred_at, or its
-- UUIDv7 id's time) may belong to an aggregate the consumer joined mid-way.
CREATE TABLE IF NOT EXISTS inbox_consumers (
    consumer_name text        PRIMARY KEY,
    started_at    timestamptz NOT NULL DEFAULT now()
);
