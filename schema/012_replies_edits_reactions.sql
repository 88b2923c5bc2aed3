-- 012: contract v3 section 12: replies, edits, reactions.
--
-- The log stays append-only: a reply is a msg with `reply_to`; an edit and a
-- reaction are events of their own (kinds 'edit' and 'reaction', target in
-- target_seq, an edit's body in body). No stored request_hash changes: a
-- send without reply_to keeps the fingerprint of contract section 6.
--
-- What a page shows of a msg's later changes (section 12) is read without
-- a query per event from two tables the edit and react statements maintain
-- (schema/functions/im_change.sql) under the conversation row lock:
-- msg_changes, one row per changed msg (the winning edit, the newest
-- reaction event's seq), and reaction_counts, one row per (msg, emoji).
-- reaction_state is each user's current state per (msg, emoji): the no-op
-- rule and the 20-emoji limit read it, and `me` in pages.

ALTER TABLE conversations
    ADD COLUMN edit_window_ms bigint NOT NULL DEFAULT 172800000 CHECK (edit_window_ms >= 0);

-- NOT VALID first (a brief lock), then validated without blocking writers.
ALTER TABLE events DROP CONSTRAINT events_kind_check;
ALTER TABLE events ADD CONSTRAINT events_kind_check
    CHECK (kind IN ('msg', 'recall', 'join', 'leave', 'edit', 'reaction')) NOT VALID;
ALTER TABLE events VALIDATE CONSTRAINT events_kind_check;

ALTER TABLE events
    ADD COLUMN reply_to bigint,         -- msg: the seq it replies to
    ADD COLUMN emoji    text,           -- reaction
    ADD COLUMN react_on boolean;        -- reaction: on or off

CREATE TABLE msg_changes (
    conv_id       text NOT NULL,
    seq           bigint NOT NULL,      -- the msg
    edit_seq      bigint,               -- the winning (highest) edit, NULL: never edited
    edit_body     text,
    edit_at       timestamptz,
    reactions_seq bigint,               -- the newest reaction event on it
    PRIMARY KEY (conv_id, seq)
);

CREATE TABLE reaction_counts (
    conv_id    text NOT NULL,
    target_seq bigint NOT NULL,
    emoji      text NOT NULL,
    count      bigint NOT NULL CHECK (count >= 0),
    PRIMARY KEY (conv_id, target_seq, emoji)
);
-- The top 20 of one msg, most counted first, read straight off the index.
CREATE INDEX reaction_counts_top
    ON reaction_counts (conv_id, target_seq, count DESC, emoji COLLATE "C") WHERE count > 0;

CREATE TABLE reaction_state (
    conv_id    text NOT NULL,
    target_seq bigint NOT NULL,
    user_id    text NOT NULL,
    emoji      text NOT NULL,
    is_on      boolean NOT NULL,
    seq        bigint NOT NULL,         -- the reaction event that set this state
    PRIMARY KEY (conv_id, target_seq, user_id, emoji)
);
-- `me` of a page: the reader's own reactions in the page's seq range.
CREATE INDEX reaction_state_by_user
    ON reaction_state (conv_id, user_id, target_seq) WHERE is_on;
