-- 002: every unique constraint on events includes conv_id.
-- A distributed PostgreSQL (Citus-style) that spreads events by conversation
-- can only enforce a unique constraint that contains the distribution column;
-- UNIQUE (mid) alone ruled that out. mid stays a random UUID
-- (gen_random_uuid), so it is still unique in practice; the database now
-- guarantees uniqueness per conversation, which is what a shard can check.
-- Nothing reads events by mid alone: the server finds an event by
-- (conv_id, seq) or by its request key (conv_id, sender_user, client_msg_id).
-- See docs/scaling.md.

ALTER TABLE events DROP CONSTRAINT events_mid_key;
ALTER TABLE events ADD CONSTRAINT events_conv_mid_key UNIQUE (conv_id, mid);
