-- im_send_queued: a send whose conversation row was held, tried again
-- waiting in the row's lock queue (contract section 6: late arrivals queue
-- on the row lock).
--
-- im_send skips a conversation whose gate or row another transaction holds
-- (a try of the gate, SKIP LOCKED of the row): a group of runs never waits
-- on a conversation it does not need, and the run comes back LOCKED,
-- unwritten. Retried the same way, the run would be a lottery ticket
-- against whichever gateway holds the row (it wins every time the row
-- frees between its own statements; seen: 24 senders on one gateway, ack
-- p99 36 ms, one sender on another, 530 ms). So the retry
-- (send_scheduler.hpp, "lock waiters") calls this function instead, for
-- the runs of ONE conversation: it takes the devices' gates shared, then
-- WAITS for the conversation's gate (schema/functions/im_conv_gate.sql:
-- PostgreSQL's lock manager serves its waiters in order, whichever gateway
-- they come from, and a try by anyone else fails while they wait) and for
-- its row FOR NO KEY UPDATE (held only by a writer that is not a send: a
-- recall, an operator), for at most p_lock_timeout_ms in all (SET LOCAL
-- lock_timeout: 55P03 when a wait passes it, which the gateway answers by
-- trying again until --db-timeout-ms is spent). Then it runs im_send in
-- the same transaction: a gate or row its own transaction holds is its own,
-- so every item is judged exactly as in any other send.
--
-- The order of the locks is im_send's: the device gates (shared, in device
-- order; schema/functions/im_device_gate.sql), then the conversation's gate
-- and row, then (inside im_send) the device rows FOR SHARE. A recall takes
-- the device gate, the device row and then the conversation row: nothing
-- here waits for a device gate while holding a conversation's gate or row.
-- Step 0 of the contract holds as in im_send: only a member (with a valid
-- device) ever waits on the conversation.
--
-- FOR NO KEY UPDATE (here and in im_send): a send changes no key of the
-- conversation row, and FOR UPDATE would also collide with the FOR KEY
-- SHARE that every insert referencing the conversation takes (a first
-- ack or read marker, a member added).
--
-- im_send_lock alone is what the lab's broken send variants (lab_schema.cpp)
-- are run behind, in one transaction with them (Store::send_run).

CREATE OR REPLACE FUNCTION im_send_lock(p_lock_timeout_ms integer, p_devices text[], p_token_sha256s text[],
                                        p_convs text[], p_users text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    locked integer;
    v_until timestamptz := clock_timestamp() + make_interval(secs => greatest(p_lock_timeout_ms, 1) / 1000.0);
BEGIN
    PERFORM set_config('lock_timeout', greatest(p_lock_timeout_ms, 1)::text || 'ms', true);
    PERFORM pg_advisory_xact_lock_shared(im_device_gate_key(g.dev))
       FROM (SELECT DISTINCT dev FROM unnest(p_devices) AS dev ORDER BY dev) g;
    PERFORM pg_advisory_xact_lock(im_conv_gate_key(c.conv))
       FROM (SELECT DISTINCT r.conv
               FROM unnest(p_devices, p_token_sha256s, p_convs, p_users) AS r(dev, tok, conv, usr)
               JOIN devices d ON d.device_id = r.dev AND d.user_id = r.usr
                             AND d.token_sha256 = decode(r.tok, 'hex') AND d.revoked_at IS NULL
              WHERE EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = r.conv AND m.user_id = r.usr OFFSET 0)
              ORDER BY r.conv) c;
    -- What is left of the bound, for the row.
    PERFORM set_config('lock_timeout',
                       greatest(1, ceil(extract(epoch FROM v_until - clock_timestamp()) * 1000))::bigint::text || 'ms',
                       true);
    SELECT count(*) INTO locked FROM (
        SELECT cv.conv_id
          FROM conversations cv
         WHERE cv.conv_id IN (
                SELECT r.conv
                  FROM unnest(p_devices, p_token_sha256s, p_convs, p_users) AS r(dev, tok, conv, usr)
                  JOIN devices d ON d.device_id = r.dev AND d.user_id = r.usr
                                AND d.token_sha256 = decode(r.tok, 'hex') AND d.revoked_at IS NULL
                 WHERE EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = r.conv AND m.user_id = r.usr OFFSET 0))
         ORDER BY cv.conv_id
           FOR NO KEY UPDATE OF cv) l;
    RETURN locked;
END
$$;

CREATE OR REPLACE FUNCTION im_send_queued(p_lock_timeout_ms integer,
                                          p_devices text[], p_token_sha256s text[], p_convs text[], p_users text[],
                                          p_runs integer[], p_cmids text[], p_bodies text[], p_prevs text[],
                                          p_reply_tos bigint[], p_atts text[], p_channel text)
RETURNS TABLE (r_run integer, r_item integer, r_code text, r_seq bigint, r_mid text, r_epoch bigint, r_dup boolean,
               r_ts bigint, r_atts text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM im_send_lock(p_lock_timeout_ms, p_devices, p_token_sha256s, p_convs, p_users);
    RETURN QUERY SELECT * FROM im_send(p_devices, p_token_sha256s, p_convs, p_users, p_runs, p_cmids, p_bodies,
                                       p_prevs, p_reply_tos, p_atts, p_channel);
END
$$;
