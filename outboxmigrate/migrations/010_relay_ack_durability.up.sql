-- outbox 010: what each relay's destination acknowledgement is worth. A
-- relay checks at start whether an acknowledged message survives the loss
-- of the broker server that acknowledged it (outbox.DurabilityChecker: a
-- JetStream stream's storage and replicas, a Kafka topic's replication
-- factor and min.insync.replicas, a RabbitMQ queue's type) and records the
-- report in its heartbeat row, so that `outbox status`, run anywhere, shows
-- it. NULL: not recorded (a relay older than this migration, or one that has
-- not checked yet). The document is outbox.AckDurability as JSON:
-- {"checked", "destination", "durable", "reason", "summary", "checked_at"}.
--
-- Upgrading: a nullable column, nothing rewritten.

ALTER TABLE outbox_relays ADD COLUMN IF NOT EXISTS ack_durability jsonb;
