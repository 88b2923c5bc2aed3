-- 016: events to the app's backend (server.md "Events to the app's backend
-- (webhooks)"; docs/operations.md, "Webhooks").
--
-- The event source is the events table itself: no outbox, no trigger, no
-- change to the send statement. Within a conversation, events commit in seq
-- order (each writer holds the conversation row until COMMIT, and seq comes
-- from that row), so a reader that saw seq N committed also sees every seq
-- below it: a cursor per (webhook, conversation) never skips an event that
-- commits late. The deliverer (server/src/net/webhook_deliverer.cpp) finds
-- work by comparing each cursor with the conversation's head (next_seq - 1).
CREATE TABLE webhooks (
    webhook_id      text PRIMARY KEY,
    url             text NOT NULL CHECK (url ~ '^https?://' AND length(url) <= 2048),
    kinds           text[] NOT NULL,        -- of msg, edit, recall, reaction, join, leave
    secret          text NOT NULL,          -- the HMAC key (must be readable: it signs)
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_success_at timestamptz,
    last_error      text,
    last_error_at   timestamptz
);

-- One row per (webhook, conversation): every event up to done_seq was
-- delivered (or failed for good: webhook_failures). A registration writes a
-- row at each conversation's head (only later events are delivered); a
-- conversation without a row (made after it) is added with done_seq 0.
-- A delivery holds the row's lease (lease_owner, lease_until), taken with
-- FOR UPDATE SKIP LOCKED in a short transaction; the HTTP call runs
-- outside any transaction; its outcome is written only if lease_seq is
-- still the one it claimed with (a replay or a takeover bumps it).
CREATE TABLE webhook_cursors (
    webhook_id    text NOT NULL REFERENCES webhooks(webhook_id) ON DELETE CASCADE,
    conv_id       text NOT NULL,
    done_seq      bigint NOT NULL,
    lease_owner   text,
    lease_until   timestamptz,
    lease_seq     bigint NOT NULL DEFAULT 0,
    attempts      integer NOT NULL DEFAULT 0,     -- failed attempts of the current batch
    retry_at      timestamptz NOT NULL DEFAULT '-infinity',
    failing_since timestamptz,                    -- first failure of the current batch
    last_error    text,
    PRIMARY KEY (webhook_id, conv_id)
);

-- Events given up on after --webhook-give-up-ms (72 h) of failures: listed
-- by GET /v1/webhooks/{id}/deliveries?status=failed, replayable.
CREATE TABLE webhook_failures (
    webhook_id text NOT NULL REFERENCES webhooks(webhook_id) ON DELETE CASCADE,
    conv_id    text NOT NULL,
    from_seq   bigint NOT NULL,
    to_seq     bigint NOT NULL,
    attempts   integer NOT NULL,
    last_error text,
    failed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (webhook_id, conv_id, from_seq)
);
