-- 001: the baseline: the core contract tables (spec section 10).
-- Migrations 001-007 of the development history squashed into one file
-- before the first release (nothing had been released): tables, indexes
-- and constraints only. Functions live once each in schema/functions/ and
-- are applied whenever their file changes (docs/operations.md, "Schema").
-- From here on the numbered files are append-only: an applied migration is
-- never edited (a start refuses a database whose recorded checksum differs
-- from the file); add a new numbered file instead.

CREATE TABLE users (
    user_id     text PRIMARY KEY CHECK (user_id ~ '^[A-Za-z0-9._:-]{1,64}$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE devices (
    device_id       text PRIMARY KEY CHECK (device_id ~ '^[A-Za-z0-9._:-]{1,64}$'),
    user_id         text NOT NULL REFERENCES users(user_id),
    token_sha256    bytea NOT NULL UNIQUE,      -- only the hash of the secret is stored
    current_install text,                       -- NULL until the first hello
    revoked_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- Every install a device has used; all but current_install are superseded.
CREATE TABLE device_installs (
    device_id     text NOT NULL REFERENCES devices(device_id),
    install_id    text NOT NULL,
    first_seen    timestamptz NOT NULL DEFAULT now(),
    superseded_at timestamptz,
    PRIMARY KEY (device_id, install_id)
);

CREATE TABLE conversations (
    conv_id          text PRIMARY KEY CHECK (conv_id ~ '^[A-Za-z0-9._:-]{1,64}$'),
    kind             text NOT NULL CHECK (kind IN ('direct', 'group')),
    next_seq         bigint NOT NULL DEFAULT 1 CHECK (next_seq >= 1),
    epoch            bigint NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    min_seq          bigint NOT NULL DEFAULT 1 CHECK (min_seq >= 1),
    recall_window_ms bigint NOT NULL DEFAULT 120000 CHECK (recall_window_ms >= 0),
    push_full_max    integer NOT NULL DEFAULT 50 CHECK (push_full_max >= 0),
    msg_count        bigint NOT NULL DEFAULT 0,  -- msg events ever appended
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Events are immutable once committed; retention purge is the only deletion.
CREATE TABLE events (
    conv_id       text NOT NULL REFERENCES conversations(conv_id),
    seq           bigint NOT NULL,
    mid           uuid NOT NULL DEFAULT gen_random_uuid(),
    kind          text NOT NULL CHECK (kind IN ('msg', 'recall', 'join', 'leave')),
    sender_user   text,                 -- NULL for join/leave written by an operator
    client_msg_id text,                 -- the request key's cmid (msg and recall)
    request_hash  bytea,                -- fingerprint of the request (C3)
    body          text,                 -- msg only
    target_seq    bigint,               -- recall only
    subject_user  text,                 -- join/leave only
    epoch         bigint NOT NULL,
    -- Running counts that make `unread` cheap (no scan of the unread range):
    msg_ordinal    bigint NOT NULL,     -- msg events in the conversation up to this seq
    sender_ordinal bigint,              -- msg: the sender's own msg events up to this seq
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (conv_id, seq),
    -- Every unique constraint on events includes conv_id, so a distributed
    -- PostgreSQL (Citus-style) that spreads events by conversation can
    -- enforce it; mid is a random UUID (gen_random_uuid), unique in practice,
    -- guaranteed unique per conversation. Nothing reads events by mid alone
    -- (docs/scaling.md).
    CONSTRAINT events_conv_mid_key UNIQUE (conv_id, mid)
);

-- C1: one event per request key. A partial unique index, never a cache.
CREATE UNIQUE INDEX events_idempotency
    ON events (conv_id, sender_user, client_msg_id)
    WHERE client_msg_id IS NOT NULL;

-- At most one recall per target; also answers "is it recalled?" cheaply.
CREATE UNIQUE INDEX events_recall_target
    ON events (conv_id, target_seq)
    WHERE kind = 'recall';

-- Last own msg at or below a seq, for the sender side of `unread`.
CREATE INDEX events_by_sender
    ON events (conv_id, sender_user, seq) WHERE kind = 'msg';

CREATE TABLE membership_periods (
    conv_id  text NOT NULL REFERENCES conversations(conv_id),
    user_id  text NOT NULL REFERENCES users(user_id),
    from_seq bigint NOT NULL,
    to_seq   bigint,                    -- NULL: still a member
    PRIMARY KEY (conv_id, user_id, from_seq),
    CHECK (to_seq IS NULL OR to_seq >= from_seq)
);
CREATE UNIQUE INDEX membership_open_period
    ON membership_periods (conv_id, user_id) WHERE to_seq IS NULL;
CREATE INDEX membership_by_user ON membership_periods (user_id, conv_id);

-- C5: request keys of purged events, written in the purge transaction.
CREATE TABLE idem_tombstones (
    conv_id       text NOT NULL,
    sender_user   text NOT NULL,
    client_msg_id text NOT NULL,
    request_hash  bytea NOT NULL,
    seq           bigint NOT NULL,
    purged_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conv_id, sender_user, client_msg_id)
);

-- Delivery per (conv, device), read per (conv, user); both only move forward.
CREATE TABLE delivery_markers (
    conv_id   text NOT NULL REFERENCES conversations(conv_id),
    device_id text NOT NULL REFERENCES devices(device_id),
    delivered bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (conv_id, device_id)
);

CREATE TABLE read_markers (
    conv_id text NOT NULL REFERENCES conversations(conv_id),
    user_id text NOT NULL REFERENCES users(user_id),
    read    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (conv_id, user_id)
);
