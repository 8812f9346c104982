-- outbox 015: what each relay's /readyz says, recorded in its heartbeat row,
-- so that the operator console and `outbox status --json`, run anywhere,
-- show every relay's and every destination's health without reaching the
-- relays' own ports. The relay writes it after each heartbeat (a relay
-- older than this migration, or one on a schema without the column, does
-- not). The document is outbox.RelayHealth as JSON: {"ready", "reason",
-- "not_ready_since", "last_error", "last_error_at", "recorded_at",
-- "minutes": [{"minute", "published", "failed"}]}, the minutes covering the
-- last hour. NULL: not recorded.
--
-- Upgrading: a nullable column, nothing rewritten.

ALTER TABLE outbox_relays ADD COLUMN IF NOT EXISTS health jsonb;
