-- outbox 007: external side effects (package sideeffect). One row per call a
-- consumer makes to a system outside its database (a payment provider, a
-- mailer) on behalf of an event, written BEFORE the call, so that the call is
-- made with the same idempotency key on every retry, an ambiguous outcome
-- (a timeout, a lost response) is remembered as such, and a reconciler can
-- ask the provider what happened. The table lives in the consumer's schema,
-- beside its inbox. docs/side-effects.md has the state machine.
--
-- Upgrading: a new table, nothing rewritten.

CREATE TABLE IF NOT EXISTS side_effects (
    -- name is the kind of effect (sideeffect.Config.Name, e.g.
    -- "payments.charge"); key is the idempotency key sent to the provider
    -- (the event id, or "<event id>/<step>"). A key is unique per name.
    name            text        NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
    key             text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
    -- What the provider offers: idempotent (it honours idempotency keys),
    -- queryable (no keys, but a lookup by key), neither.
    mode            text        NOT NULL CHECK (mode IN ('idempotent', 'queryable', 'neither')),
    -- started: claimed, the call (or a lookup) may be under way; past
    --   lease_until the caller is presumed dead and the call may have
    --   happened: it is treated as unknown.
    -- succeeded / failed: the provider's answer, final; response holds it.
    -- unknown: a call may or may not have taken effect (timeout, lost
    --   response, 5xx after the request was sent).
    -- parked: unknown past its bound, or unresolvable; an operator decides.
    state           text        NOT NULL CHECK (state IN ('started', 'succeeded', 'failed', 'unknown', 'parked')),
    -- sha256 of the request's canonical bytes: a retry with another request
    -- under the same key is refused (a programming error).
    fingerprint     bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    response        bytea,
    -- attempts counts calls that may have reached the provider; checks
    -- counts lookups; blind_retries counts calls made again without any way
    -- to know whether the earlier one took effect (mode neither): each is a
    -- possible duplicate.
    attempts        integer     NOT NULL DEFAULT 0,
    checks          integer     NOT NULL DEFAULT 0,
    blind_retries   integer     NOT NULL DEFAULT 0,
    -- The claim: whoever holds lease_token until lease_until may call and
    -- record; every write-back is fenced by the token, which every claim
    -- increments.
    lease_token     bigint      NOT NULL DEFAULT 1,
    lease_until     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    last_attempt_at timestamptz,
    -- When the outcome became ambiguous (the bound's max age counts from
    -- it); NULL while it never was.
    unknown_since   timestamptz,
    -- When the reconciler looks next: for started, the lease's end; for
    -- unknown, after a backoff.
    next_check_at   timestamptz,
    last_error      text,
    -- How the final state was learnt: call, lookup or operator.
    resolved_via    text CHECK (resolved_via IN ('call', 'lookup', 'operator')),
    parked_at       timestamptz,
    park_reason     text,
    -- An operator let the next Do call again (sideeffect.Admin.Resolve,
    -- retry), whatever the mode and the bound; that Do clears it.
    operator_retry  boolean     NOT NULL DEFAULT false,
    -- The last operator action on the row (also in outbox_operations).
    operator_at     timestamptz,
    operator_by     text,
    operator_reason text,
    PRIMARY KEY (name, key),
    CHECK (state <> 'parked' OR (parked_at IS NOT NULL AND coalesce(park_reason, '') <> ''))
);

-- The reconciler's work: open attempts due for a check. Open attempts are
-- few next to the finished ones, so this index stays small.
CREATE INDEX IF NOT EXISTS side_effects_due_idx
    ON side_effects (name, next_check_at)
    WHERE state IN ('started', 'unknown');

-- Parked attempts, listed oldest first by status and the operator.
CREATE INDEX IF NOT EXISTS side_effects_parked_idx
    ON side_effects (parked_at, name, key)
    WHERE state = 'parked';
