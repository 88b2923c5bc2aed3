-- 015: moderation (server.md, "Rate limits and moderation"; issue 52 item 3).
-- A mute silences a member in one conversation until `until` (NULL: until
-- removed): their send, edit, react and typing answer MUTED, reads go on.
-- im_send and im_change read this table once per run / request by its
-- primary key (an empty table in the common case: one index probe).
-- Expired rows are harmless (the check compares `until` with the clock) and
-- are replaced by the next mute or removed by an unmute.
CREATE TABLE conversation_mutes (
    conv_id    text NOT NULL REFERENCES conversations(conv_id),
    user_id    text NOT NULL REFERENCES users(user_id),
    until      timestamptz,                 -- NULL: until removed
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conv_id, user_id)
);
