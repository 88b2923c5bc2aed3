-- im_change: contract section 12, `edit` and `react`: one request, one
-- statement, one round trip (Store::change, server/src/store/store_changes.cpp),
-- autocommit (the call is the transaction). The caller publishes the
-- notification after COMMIT, as for a recall (api/api.cpp), and publishes
-- again for a duplicate.
--
-- p_kind 'edit' (p_body) or 'reaction' (p_emoji, p_on). The checks run in
-- the contract's order, inside the conversation row lock:
--   0. without any lock: the caller has (or had) a period here (NOT_MEMBER),
--      and the device still has its access (UNAUTHENTICATED): its gate
--      shared, then its row FOR SHARE until COMMIT (as im_send and recall);
--   1. the conversation row FOR NO KEY UPDATE (the sends' row lock: appends
--      take their seqs in commit order);
--   2. the request key: the same kind and fingerprint: the original's
--      event, dup; else IDEMPOTENCY_MISMATCH (a key of a send or a recall
--      never matches: C3, another kind of request is other content);
--   3. the key's tombstone: ORIGINAL_EXPIRED;
--   4. the target exists and is not purged (NOT_FOUND), the caller may read
--      it (NOT_MEMBER), it is a msg (INVALID_ARGUMENT), edit: the caller sent
--      it (NOT_SENDER), it is not recalled (ALREADY_RECALLED), edit: the
--      database clock is within the conversation's edit_window_ms of its
--      created_at, 0 = no edits (EDIT_WINDOW_EXPIRED);
--   5. an open period (NOT_MEMBER); not muted (MUTED, schema/015);
--   6. react: the caller's state for (target, emoji) already as asked: no
--      event, r_changed false, r_seq the event that set the state (NULL when
--      an off finds nothing); turning on a 21st emoji: TOO_MANY_EMOJI
--      (INVALID_ARGUMENT on the wire);
--   7. the event at next_seq, and the read side's aggregates (schema/012):
--      msg_changes (the winning edit: the new one, its seq being the
--      highest; reactions_seq; reactions_top, the top 20 of the counts as
--      a page shows them, schema/018), reaction_counts and reaction_state.
--
-- Fingerprints: edit sha256(conv || '\0edit:' || target || '\0' || body)
-- (the contract's); react sha256(conv || '\0react:' || target || '\0' ||
-- emoji || '\0' || 'on'|'off') (docs/protocol.md: the contract names none).
--
-- One row: r_code ('OK' or a code above), r_seq, r_dup, r_changed, r_epoch.

CREATE OR REPLACE FUNCTION im_change(p_kind text, p_device text, p_token_sha256 text, p_conv text, p_user text,
                                     p_cmid text, p_target bigint, p_body text, p_emoji text, p_on boolean)
RETURNS TABLE (r_code text, r_seq bigint, r_dup boolean, r_changed boolean, r_epoch bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz;
    v_fp   bytea;
    cv     record;
    o      record;
    t      record;
    st     record;
    v_open boolean;
    v_head bigint;
    v_seq  bigint;
    v_ep   bigint;
BEGIN
    IF p_kind = 'edit' THEN
        v_fp := sha256(convert_to(p_conv, 'UTF8') || '\x00'::bytea || convert_to('edit:' || p_target::text, 'UTF8')
                       || '\x00'::bytea || convert_to(p_body, 'UTF8'));
    ELSIF p_kind = 'reaction' THEN
        v_fp := sha256(convert_to(p_conv, 'UTF8') || '\x00'::bytea || convert_to('react:' || p_target::text, 'UTF8')
                       || '\x00'::bytea || convert_to(p_emoji, 'UTF8')
                       || '\x00'::bytea || convert_to(CASE WHEN p_on THEN 'on' ELSE 'off' END, 'UTF8'));
    ELSE
        RAISE EXCEPTION 'im_change: unknown kind %', p_kind USING ERRCODE = '22023';
    END IF;
    -- 0. A member at all, before any lock (C4); the device's access.
    IF NOT EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = p_conv AND m.user_id = p_user) THEN
        RETURN QUERY SELECT 'NOT_MEMBER'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(im_device_gate_key(p_device));
    PERFORM 1 FROM devices d
      WHERE d.device_id = p_device AND d.user_id = p_user AND d.token_sha256 = decode(p_token_sha256, 'hex')
        AND d.revoked_at IS NULL
        FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'UNAUTHENTICATED'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    -- 1. The row lock.
    SELECT c.next_seq, c.epoch, c.min_seq, c.edit_window_ms INTO cv
      FROM conversations c WHERE c.conv_id = p_conv FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'NOT_MEMBER'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    SELECT bool_or(m.to_seq IS NULL), max(m.to_seq) INTO v_open, v_head
      FROM membership_periods m WHERE m.conv_id = p_conv AND m.user_id = p_user;
    IF v_open THEN v_head := cv.next_seq - 1; END IF;
    -- 2. The request key (through its index: OFFSET 0, as in im_send).
    SELECT f.seq, f.kind, f.request_hash, f.epoch INTO o
      FROM (SELECT e.seq, e.kind, e.request_hash, e.epoch FROM events e
             WHERE e.conv_id = p_conv AND e.sender_user = p_user AND e.client_msg_id = p_cmid OFFSET 0) f
     ORDER BY f.seq LIMIT 1;
    IF FOUND THEN
        IF o.kind = p_kind AND o.request_hash = v_fp THEN
            RETURN QUERY SELECT 'OK'::text, o.seq, true, true, o.epoch;
        ELSE
            RETURN QUERY SELECT 'IDEMPOTENCY_MISMATCH'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        END IF;
        RETURN;
    END IF;
    -- 3. The tombstone.
    IF EXISTS (SELECT 1 FROM idem_tombstones x
                WHERE x.conv_id = p_conv AND x.sender_user = p_user AND x.client_msg_id = p_cmid) THEN
        RETURN QUERY SELECT 'ORIGINAL_EXPIRED'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    -- 4. The target.
    IF p_target < 1 OR p_target > v_head OR p_target < cv.min_seq THEN
        RETURN QUERY SELECT 'NOT_FOUND'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    SELECT e.kind, e.sender_user, e.created_at INTO t FROM events e WHERE e.conv_id = p_conv AND e.seq = p_target;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'NOT_FOUND'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM membership_periods m
                    WHERE m.conv_id = p_conv AND m.user_id = p_user AND m.from_seq <= p_target
                      AND (m.to_seq IS NULL OR m.to_seq >= p_target)) THEN
        RETURN QUERY SELECT 'NOT_MEMBER'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    IF t.kind <> 'msg' THEN
        RETURN QUERY SELECT 'INVALID_ARGUMENT'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    IF p_kind = 'edit' AND t.sender_user IS DISTINCT FROM p_user THEN
        RETURN QUERY SELECT 'NOT_SENDER'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM events r WHERE r.conv_id = p_conv AND r.kind = 'recall' AND r.target_seq = p_target) THEN
        RETURN QUERY SELECT 'ALREADY_RECALLED'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    v_now := clock_timestamp();
    IF p_kind = 'edit' AND (cv.edit_window_ms = 0
                            OR v_now > t.created_at + cv.edit_window_ms * interval '1 millisecond') THEN
        RETURN QUERY SELECT 'EDIT_WINDOW_EXPIRED'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    -- 5. Write access.
    IF NOT v_open THEN
        RETURN QUERY SELECT 'NOT_MEMBER'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    -- 5'. A muted member writes nothing (schema/015, server.md moderation).
    IF EXISTS (SELECT 1 FROM conversation_mutes mu
                WHERE mu.conv_id = p_conv AND mu.user_id = p_user AND (mu.until IS NULL OR mu.until > v_now)) THEN
        RETURN QUERY SELECT 'MUTED'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    -- 6. A reaction already as asked appends nothing.
    IF p_kind = 'reaction' THEN
        SELECT s.is_on, s.seq INTO st FROM reaction_state s
         WHERE s.conv_id = p_conv AND s.target_seq = p_target AND s.user_id = p_user AND s.emoji = p_emoji;
        IF (FOUND AND st.is_on = p_on) OR (NOT FOUND AND NOT p_on) THEN
            RETURN QUERY SELECT 'OK'::text, st.seq, false, false, cv.epoch;
            RETURN;
        END IF;
        IF p_on AND (SELECT count(*) FROM reaction_state s
                      WHERE s.conv_id = p_conv AND s.target_seq = p_target AND s.user_id = p_user AND s.is_on) >= 20 THEN
            RETURN QUERY SELECT 'TOO_MANY_EMOJI'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
            RETURN;
        END IF;
    END IF;
    -- 7. The event, then the aggregates the reads show.
    UPDATE conversations c SET next_seq = c.next_seq + 1 WHERE c.conv_id = p_conv
    RETURNING c.next_seq - 1, c.epoch INTO v_seq, v_ep;
    INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, target_seq, emoji,
                        react_on, epoch, msg_ordinal, created_at)
    SELECT p_conv, v_seq, p_kind, p_user, p_cmid, v_fp, CASE WHEN p_kind = 'edit' THEN p_body END, p_target,
           CASE WHEN p_kind = 'reaction' THEN p_emoji END, CASE WHEN p_kind = 'reaction' THEN p_on END, v_ep,
           c.msg_count, v_now
      FROM conversations c WHERE c.conv_id = p_conv;
    IF p_kind = 'edit' THEN
        INSERT INTO msg_changes AS x (conv_id, seq, edit_seq, edit_body, edit_at)
        VALUES (p_conv, p_target, v_seq, p_body, v_now)
        ON CONFLICT (conv_id, seq) DO UPDATE SET edit_seq = v_seq, edit_body = p_body, edit_at = v_now;
    ELSE
        INSERT INTO reaction_state AS s (conv_id, target_seq, user_id, emoji, is_on, seq)
        VALUES (p_conv, p_target, p_user, p_emoji, p_on, v_seq)
        ON CONFLICT (conv_id, target_seq, user_id, emoji) DO UPDATE SET is_on = p_on, seq = v_seq;
        INSERT INTO reaction_counts AS n (conv_id, target_seq, emoji, count)
        VALUES (p_conv, p_target, p_emoji, CASE WHEN p_on THEN 1 ELSE 0 END)
        ON CONFLICT (conv_id, target_seq, emoji)
        DO UPDATE SET count = n.count + CASE WHEN p_on THEN 1 ELSE -1 END;
        -- The summary a page shows (schema/018): the top 20 of the counts
        -- just written, read off reaction_counts_top (at most 20 rows).
        INSERT INTO msg_changes AS x (conv_id, seq, reactions_seq, reactions_top)
        SELECT p_conv, p_target, v_seq,
               (SELECT json_agg(json_build_array(tp.emoji, tp.count) ORDER BY tp.count DESC, tp.emoji COLLATE "C")::text
                  FROM (SELECT n.emoji, n.count FROM reaction_counts n
                         WHERE n.conv_id = p_conv AND n.target_seq = p_target AND n.count > 0
                         ORDER BY n.count DESC, n.emoji COLLATE "C" LIMIT 20) tp)
        ON CONFLICT (conv_id, seq) DO UPDATE SET reactions_seq = v_seq, reactions_top = EXCLUDED.reactions_top;
    END IF;
    RETURN QUERY SELECT 'OK'::text, v_seq, false, true, v_ep;
END
$$;

-- im_write_group: a group of runs (send_scheduler.hpp) whose items include
-- an `edit` or a `react` beside sends, in ONE statement and one commit as a
-- group of sends is (Store::send_group; a group of sends alone calls
-- im_send directly). p_kinds[i] is 'msg' (a send: p_cmids, p_bodies,
-- p_prevs, p_reply_tos, p_atts as for im_send), 'edit' (p_targets,
-- p_bodies) or 'reaction' (p_targets, p_emojis, p_ons); the rest as im_send's.
--
-- It only orders the items; every check stays where it was: the items are
-- judged in their order (run by run, item by item, so per conversation in
-- arrival order per connection), a stretch of consecutive sends by one call
-- of im_send, each edit or react by one call of im_change, all in this
-- transaction under the conversation's row lock. So an edit or react sees
-- the sends (and changes) before it in the group, the seqs are gap-free in
-- item order, and a repeated key answers dup:true as across commits.
--
-- The locks are im_send's, taken by the same function (im_lock_runs,
-- schema/functions/im_send.sql): the devices' gates shared (device order),
-- then the runs' conversation rows FOR NO KEY UPDATE SKIP LOCKED with the
-- devices' rows FOR SHARE (members with a valid device only), each row's
-- gate tried. A run whose row or gate another transaction holds is LOCKED
-- as in im_send: nothing of it is written, the caller runs it again later. With p_lock_timeout_ms > 0 (the
-- caller's lock waiter, for the runs of ONE conversation), im_send_lock
-- waits for them first (im_send_queued.sql). im_send and im_change find the
-- gates and rows already this transaction's, so they never wait; the
-- notification (p_channel) goes out once, here, for all the OK items that
-- have an event (a react that changed nothing and is no dup: none).
--
-- One row per item, in item order: im_send's columns (r_mid, r_ts, r_atts
-- NULL for a change) and r_changed (a change's, NULL for a send).

CREATE OR REPLACE FUNCTION im_write_group(p_lock_timeout_ms integer, p_devices text[], p_token_sha256s text[],
                                          p_convs text[], p_users text[], p_runs integer[], p_kinds text[],
                                          p_cmids text[], p_bodies text[], p_prevs text[], p_reply_tos bigint[],
                                          p_atts text[], p_targets bigint[], p_emojis text[], p_ons boolean[],
                                          p_channel text)
RETURNS TABLE (r_run integer, r_item integer, r_code text, r_seq bigint, r_mid text, r_epoch bigint, r_dup boolean,
               r_ts bigint, r_atts text, r_changed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    nr     integer := coalesce(array_length(p_convs, 1), 0);
    n      integer := coalesce(array_length(p_runs, 1), 0);
    held   boolean[] := array_fill(false, ARRAY[nr]);
    a_code text[] := array_fill(NULL::text, ARRAY[n]);
    a_seq  bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_mid  text[] := array_fill(NULL::text, ARRAY[n]);
    a_ep   bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_dup  boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    a_ts   bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_att  text[] := array_fill(NULL::text, ARRAY[n]);
    a_chg  boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    seg    integer[];                                          -- the items of one stretch of sends
    ix     integer;
    run    integer;
    k      record;
BEGIN
    IF p_lock_timeout_ms > 0 THEN
        PERFORM im_send_lock(p_lock_timeout_ms, p_devices, p_token_sha256s, p_convs, p_users);
    END IF;
    -- The locks, as im_send takes them (im_lock_runs, schema/functions/
    -- im_send.sql). Held: a member with a valid device whose conversation's
    -- row or gate is another transaction's (LOCKED); a stranger or a revoked
    -- device is answered by im_send and im_change, without a lock.
    FOR k IN SELECT l.r_run, l.r_code FROM im_lock_runs(p_devices, p_token_sha256s, p_convs, p_users) l LOOP
        held[k.r_run] := k.r_code IS NOT DISTINCT FROM 'LOCKED';
    END LOOP;
    ix := 1;
    WHILE ix <= n LOOP
        run := p_runs[ix];
        IF held[run] THEN
            a_code[ix] := 'LOCKED';
            ix := ix + 1;
        ELSIF p_kinds[ix] = 'msg' THEN
            -- A stretch of consecutive sends: one call of im_send.
            seg := ARRAY[]::integer[];
            WHILE ix <= n AND p_kinds[ix] = 'msg' LOOP
                IF held[p_runs[ix]] THEN a_code[ix] := 'LOCKED'; ELSE seg := seg || ix; END IF;
                ix := ix + 1;
            END LOOP;
            FOR k IN
                SELECT s.r_item, s.r_code, s.r_seq, s.r_mid, s.r_epoch, s.r_dup, s.r_ts, s.r_atts
                  FROM im_send(p_devices, p_token_sha256s, p_convs, p_users,
                               ARRAY(SELECT p_runs[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT p_cmids[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT p_bodies[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT p_prevs[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT p_reply_tos[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT p_atts[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               '') s
            LOOP
                a_code[seg[k.r_item]] := k.r_code; a_seq[seg[k.r_item]] := k.r_seq;
                a_mid[seg[k.r_item]] := k.r_mid; a_ep[seg[k.r_item]] := k.r_epoch;
                a_dup[seg[k.r_item]] := k.r_dup; a_ts[seg[k.r_item]] := k.r_ts; a_att[seg[k.r_item]] := k.r_atts;
            END LOOP;
        ELSE
            SELECT c.r_code, c.r_seq, c.r_dup, c.r_changed, c.r_epoch INTO k
              FROM im_change(p_kinds[ix], p_devices[run], p_token_sha256s[run], p_convs[run], p_users[run],
                             p_cmids[ix], p_targets[ix], coalesce(p_bodies[ix], ''), coalesce(p_emojis[ix], ''),
                             coalesce(p_ons[ix], false)) c;
            a_code[ix] := k.r_code; a_seq[ix] := k.r_seq; a_dup[ix] := k.r_dup; a_chg[ix] := k.r_changed;
            a_ep[ix] := k.r_epoch;
            ix := ix + 1;
        END IF;
    END LOOP;
    IF p_channel <> '' THEN
        PERFORM pg_notify(p_channel, 'e ' || c.conv || ' ' || c.hi || CASE WHEN c.lo < c.hi THEN ' ' || c.lo ELSE '' END)
           FROM (SELECT p_convs[u.g] AS conv, max(u.seq) AS hi, min(u.seq) AS lo
                   FROM unnest(p_runs, p_kinds, a_code, a_seq, a_dup, a_chg) AS u(g, kind, code, seq, dup, chg)
                  WHERE u.code = 'OK' AND u.seq IS NOT NULL AND (u.kind <> 'reaction' OR u.chg OR u.dup)
                  GROUP BY p_convs[u.g]) c;
    END IF;
    RETURN QUERY
        SELECT u.g, u.i::integer, u.code, u.seq, u.mid, u.ep, u.dup, u.ts, u.att, u.chg
          FROM unnest(p_runs, a_code, a_seq, a_mid, a_ep, a_dup, a_ts, a_att, a_chg) WITH ORDINALITY
               AS u(g, code, seq, mid, ep, dup, ts, att, chg, i)
         ORDER BY u.i;
END
$$;
