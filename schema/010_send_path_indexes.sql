-- 010: no work the conversation's row lock already does (issue 28, item 2).
--
-- The foreign key events.conv_id -> conversations goes. Every writer of
-- events holds the conversation's row before it inserts (im_send locks it
-- FOR UPDATE in step 1; recall and the admin appends insert FROM the UPDATE
-- of the row's counters, server/src/store.cpp append_event), so the row's
-- existence is already proven by the lock; the key only
-- added, per inserted event, one more query (the RI trigger's SELECT ... FOR
-- KEY SHARE of the row this transaction already holds). Conversations are
-- never deleted; retention deletes events only.
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_conv_id_fkey;

-- The UNIQUE (conv_id, mid) constraint goes: no query reads events by mid
-- (sync, history, fetch and push read by (conv_id, seq); the request key
-- reads by (conv_id, sender_user, client_msg_id)), and its B-tree on a random
-- UUID scattered every insert over the whole index (a full-page write per
-- touched page after each checkpoint). mid stays a random UUID
-- (gen_random_uuid, 122 random bits): unique in practice, and permanent.
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_conv_mid_key;

-- The indexes of events that stay, each with the query that reads it:
--   events_pkey (conv_id, seq): every range read (sync, history, fetch, the
--     push reads, recall's target) and the seq's uniqueness under the lock.
--   events_idempotency (conv_id, sender_user, client_msg_id) partial unique:
--     contract C1, the request-key lookup of im_send and recall, and `prev`.
--   events_recall_target (conv_id, target_seq) partial unique: one recall
--     per target, and "is it recalled?" of the event reads.
--   events_by_sender (conv_id, sender_user, seq) partial: the sender's last
--     msg ordinal (im_send) and the sender side of `unread` (convs).
COMMENT ON TABLE events IS
    'Immutable once committed; retention purge is the only deletion. No foreign key to conversations: every writer holds the conversation row lock (schema/010).';
