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
--      take their seqs in commit order), waited for;
--   then steps 2-7 by im_change_items (below), as for a group's changes:
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

-- im_change_items: the judgment and the writes of contract section 12 for
-- a stretch of `edit` and `react` items, set-based as im_send is for sends
-- (the ONE place of these checks: im_change below runs a lone request
-- through it, im_write_group a stretch of a group's). Whatever the
-- stretch's size, a fixed number of statements: (1) one lookup of every
-- item's conversation, request key, tombstone, target and reaction state,
-- then the checks in memory, item by item in order (no statement), then
-- (2) one counter update, (3) one INSERT of the new events, and one upsert
-- each of msg_changes' edits, reaction_state, reaction_counts and
-- msg_changes' reactions summary.
--
-- The CALLER holds every judged run's locks, as im_lock_runs takes them:
-- the device's gate and row (shared) and the conversation's gate and row;
-- p_run_codes[g] NULL says so, else the run was left out with that code
-- (im_lock_runs'), and each of its items answers it, in a change's order:
-- NOT_MEMBER before UNAUTHENTICATED (step 0 above). Per run p_convs[g],
-- p_users[g]; item i of run p_runs[i]: p_kinds[i] ('edit' or 'reaction'),
-- p_cmids[i], p_targets[i], p_bodies[i] (an edit's), p_emojis[i] and
-- p_ons[i] (a reaction's).
--
-- Items are judged exactly as one after the other: an item sees the
-- events of the items before it, the stretch's and those the transaction
-- wrote before the call. Within the stretch that means: a repeated key is
-- the dup of the earlier item's event (same_key); a reaction's state and
-- the user's count of emoji on the target are the earlier item's
-- (st_prev, cnt_prev) when one of the stretch had the same (target, user,
-- emoji) / (target, user); a target that is a change of this stretch is
-- not a msg (INVALID_ARGUMENT); the seqs follow item order, gap-free. One
-- clock for the call: v_now, taken after the locks (the edit window's
-- database clock, the events' created_at).
--
-- One row per item, in item order: r_item, r_code, r_seq, r_dup,
-- r_changed, r_epoch (as im_change's).

CREATE OR REPLACE FUNCTION im_change_items(p_run_codes text[], p_convs text[], p_users text[], p_runs integer[],
                                           p_kinds text[], p_cmids text[], p_targets bigint[], p_bodies text[],
                                           p_emojis text[], p_ons boolean[])
RETURNS TABLE (r_item integer, r_code text, r_seq bigint, r_dup boolean, r_changed boolean, r_epoch bigint)
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
DECLARE
    nr      integer := coalesce(array_length(p_convs, 1), 0);
    n       integer := coalesce(array_length(p_runs, 1), 0);
    v_now   timestamptz := clock_timestamp();
    k       record;
    j       integer;
    c_head  bigint;
    c_cnt   bigint;
    c_on    boolean;
    c_has   boolean;
    c_sseq  bigint;
    -- per conversation, indexed by the first run of the call that has it
    conv_n    integer[] := array_fill(0, ARRAY[nr]);             -- new events so far
    conv_next bigint[] := array_fill(NULL::bigint, ARRAY[nr]);   -- next_seq before the call
    -- per item
    a_code  text[] := array_fill(NULL::text, ARRAY[n]);
    a_seq   bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_dup   boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    a_chg   boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    a_ep    bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_fp    bytea[] := array_fill(NULL::bytea, ARRAY[n]);
    a_new   boolean[] := array_fill(false, ARRAY[n]);
    a_conv  integer[] := array_fill(NULL::integer, ARRAY[n]);
    a_cnt0  bigint[] := array_fill(NULL::bigint, ARRAY[n]);      -- the conversation's msg_count (msg_ordinal)
    key_new integer[] := array_fill(NULL::integer, ARRAY[n]);    -- the item new in this call with this item's key
    -- a reaction's state for its (target, user, emoji) after the item, and
    -- the user's count of emoji on for its (target, user) after it
    st_has  boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    st_on   boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    st_seq  bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    on_cnt  bigint[] := array_fill(NULL::bigint, ARRAY[n]);
BEGIN
    -- 1. Everything the checks read, one statement for the whole stretch.
    FOR k IN
        WITH rs AS (
            SELECT r.g::integer AS g, r.conv, r.usr, p_run_codes[r.g] AS run_code,
                   min(r.g) OVER (PARTITION BY r.conv)::integer AS conv_at,
                   cv.next_seq, cv.epoch, cv.min_seq, cv.edit_window_ms, cv.msg_count,
                   mp.open, mp.closed_head, mp.member,
                   EXISTS (SELECT 1 FROM conversation_mutes mu
                            WHERE mu.conv_id = r.conv AND mu.user_id = r.usr
                              AND (mu.until IS NULL OR mu.until > v_now)) AS muted
              FROM unnest(p_convs, p_users) WITH ORDINALITY AS r(conv, usr, g)
              -- Each lookup a probe of its key (OFFSET 0: not turned into a
              -- join that reads the whole table, which the generic plan's
              -- estimate of 10 items made cheaper on small tables: measured,
              -- the events read in full per group).
              LEFT JOIN LATERAL (
                    SELECT c.next_seq, c.epoch, c.min_seq, c.edit_window_ms, c.msg_count FROM conversations c
                     WHERE c.conv_id = r.conv AND p_run_codes[r.g] IS NULL OFFSET 0) cv ON true
              CROSS JOIN LATERAL (
                    SELECT bool_or(m.to_seq IS NULL) AS open, max(m.to_seq) AS closed_head, count(*) > 0 AS member
                      FROM membership_periods m WHERE m.conv_id = r.conv AND m.user_id = r.usr) mp),
        it AS (
            SELECT u.i::integer AS i, u.kind, u.cmid, u.target, u.body, u.emoji, u.on_, rs.*,
                   CASE WHEN u.kind = 'edit'
                        THEN sha256(convert_to(rs.conv, 'UTF8') || '\x00'::bytea
                                    || convert_to('edit:' || u.target::text, 'UTF8')
                                    || '\x00'::bytea || convert_to(u.body, 'UTF8'))
                        ELSE sha256(convert_to(rs.conv, 'UTF8') || '\x00'::bytea
                                    || convert_to('react:' || u.target::text, 'UTF8')
                                    || '\x00'::bytea || convert_to(u.emoji, 'UTF8')
                                    || '\x00'::bytea || convert_to(CASE WHEN u.on_ THEN 'on' ELSE 'off' END, 'UTF8'))
                        END AS fp
              FROM unnest(p_runs, p_kinds, p_cmids, p_targets, p_bodies, p_emojis, p_ons) WITH ORDINALITY
                   AS u(g, kind, cmid, target, body, emoji, on_, i)
              JOIN rs ON rs.g = u.g)
        SELECT it.i, it.g, it.kind, it.target, it.on_, it.run_code, it.member, it.conv_at, it.next_seq, it.epoch,
               it.min_seq, it.edit_window_ms, it.msg_count, coalesce(it.open, false) AS open, it.closed_head,
               it.muted, it.fp,
               o.seq AS o_seq, o.kind AS o_kind, o.request_hash AS o_hash, o.epoch AS o_epoch,
               EXISTS (SELECT 1 FROM idem_tombstones x
                        WHERE x.conv_id = it.conv AND x.sender_user = it.usr AND x.client_msg_id = it.cmid) AS tomb,
               t.kind AS t_kind, t.sender_user AS t_sender, t.created_at AS t_at,
               EXISTS (SELECT 1 FROM membership_periods m
                        WHERE m.conv_id = it.conv AND m.user_id = it.usr AND m.from_seq <= it.target
                          AND (m.to_seq IS NULL OR m.to_seq >= it.target)) AS readable,
               EXISTS (SELECT 1 FROM events x
                        WHERE x.conv_id = it.conv AND x.kind = 'recall' AND x.target_seq = it.target) AS recalled,
               s.is_on AS s_on, s.seq AS s_seq,
               CASE WHEN it.kind = 'reaction' THEN
                   (SELECT count(*) FROM reaction_state z
                     WHERE z.conv_id = it.conv AND z.target_seq = it.target AND z.user_id = it.usr AND z.is_on) END
                  AS s_cnt,
               lag(it.i) OVER (PARTITION BY it.conv, it.usr, it.cmid ORDER BY it.i) AS same_key,
               lag(it.i) OVER (PARTITION BY it.conv, it.usr, it.target, it.kind, it.emoji ORDER BY it.i) AS st_prev,
               lag(it.i) OVER (PARTITION BY it.conv, it.usr, it.target, it.kind ORDER BY it.i) AS cnt_prev
          FROM it
          LEFT JOIN LATERAL (
                -- the request key, through its index (OFFSET 0, as in im_send)
                SELECT * FROM (
                    SELECT e.seq, e.kind, e.request_hash, e.epoch FROM events e
                     WHERE e.conv_id = it.conv AND e.sender_user = it.usr AND e.client_msg_id = it.cmid
                    OFFSET 0) f
                 ORDER BY f.seq LIMIT 1) o ON true
          LEFT JOIN LATERAL (
                SELECT t.kind, t.sender_user, t.created_at FROM events t
                 WHERE t.conv_id = it.conv AND t.seq = it.target OFFSET 0) t ON true
          LEFT JOIN LATERAL (
                SELECT s.is_on, s.seq FROM reaction_state s
                 WHERE it.kind = 'reaction' AND s.conv_id = it.conv AND s.target_seq = it.target
                   AND s.user_id = it.usr AND s.emoji = it.emoji OFFSET 0) s ON true
         ORDER BY it.i
    LOOP
        a_fp[k.i] := k.fp;
        -- A reaction's state and count before it: the stretch's earlier
        -- item's, else the table's; kept as they are unless it appends.
        IF k.kind = 'reaction' THEN
            IF k.st_prev IS NOT NULL THEN
                c_has := st_has[k.st_prev]; c_on := st_on[k.st_prev]; c_sseq := st_seq[k.st_prev];
            ELSE
                c_has := k.s_on IS NOT NULL; c_on := k.s_on; c_sseq := k.s_seq;
            END IF;
            c_cnt := CASE WHEN k.cnt_prev IS NOT NULL THEN on_cnt[k.cnt_prev] ELSE k.s_cnt END;
            st_has[k.i] := c_has; st_on[k.i] := c_on; st_seq[k.i] := c_sseq; on_cnt[k.i] := c_cnt;
        END IF;
        -- 0. A run left out by the locks (im_lock_runs): a change's order,
        --    NOT_MEMBER (no period at all) before UNAUTHENTICATED.
        IF k.run_code IS NOT NULL THEN
            a_code[k.i] := CASE WHEN k.run_code = 'UNAUTHENTICATED' AND NOT k.member THEN 'NOT_MEMBER' ELSE k.run_code END;
            CONTINUE;
        END IF;
        -- 2. The request key: the same kind and fingerprint -> the original;
        --    committed (o) or new in this call (key_new); else a mismatch.
        IF k.o_seq IS NOT NULL THEN
            IF k.o_kind = k.kind AND k.o_hash = k.fp THEN
                a_code[k.i] := 'OK'; a_seq[k.i] := k.o_seq; a_dup[k.i] := true; a_chg[k.i] := true;
                a_ep[k.i] := k.o_epoch;
            ELSE
                a_code[k.i] := 'IDEMPOTENCY_MISMATCH';
            END IF;
            CONTINUE;
        END IF;
        j := key_new[k.same_key];
        IF j IS NOT NULL THEN
            key_new[k.i] := j;
            IF p_kinds[j] = k.kind AND a_fp[j] = k.fp THEN
                a_code[k.i] := 'OK'; a_seq[k.i] := a_seq[j]; a_dup[k.i] := true; a_chg[k.i] := true;
                a_ep[k.i] := a_ep[j];
            ELSE
                a_code[k.i] := 'IDEMPOTENCY_MISMATCH';
            END IF;
            CONTINUE;
        END IF;
        -- 3. The tombstone.
        IF k.tomb THEN
            a_code[k.i] := 'ORIGINAL_EXPIRED';
            CONTINUE;
        END IF;
        -- 4. The target: exists and not purged; a change of this call is
        --    past the head the table shows, but exists (and is no msg).
        c_head := CASE WHEN k.open THEN k.next_seq - 1 + conv_n[k.conv_at] ELSE coalesce(k.closed_head, 0) END;
        IF k.target < 1 OR k.target > c_head OR k.target < k.min_seq
           OR (k.target < k.next_seq AND k.t_kind IS NULL) THEN
            a_code[k.i] := 'NOT_FOUND';
            CONTINUE;
        END IF;
        IF k.target >= k.next_seq THEN
            a_code[k.i] := 'INVALID_ARGUMENT'; -- an open period reads it: its from_seq is below next_seq
            CONTINUE;
        END IF;
        IF NOT k.readable THEN
            a_code[k.i] := 'NOT_MEMBER';
            CONTINUE;
        END IF;
        IF k.t_kind <> 'msg' THEN
            a_code[k.i] := 'INVALID_ARGUMENT';
            CONTINUE;
        END IF;
        IF k.kind = 'edit' AND k.t_sender IS DISTINCT FROM p_users[k.g] THEN
            a_code[k.i] := 'NOT_SENDER';
            CONTINUE;
        END IF;
        IF k.recalled THEN
            a_code[k.i] := 'ALREADY_RECALLED';
            CONTINUE;
        END IF;
        IF k.kind = 'edit' AND (k.edit_window_ms = 0
                                OR v_now > k.t_at + k.edit_window_ms * interval '1 millisecond') THEN
            a_code[k.i] := 'EDIT_WINDOW_EXPIRED';
            CONTINUE;
        END IF;
        -- 5. Write access; not muted (schema/015, server.md moderation).
        IF NOT k.open THEN
            a_code[k.i] := 'NOT_MEMBER';
            CONTINUE;
        END IF;
        IF k.muted THEN
            a_code[k.i] := 'MUTED';
            CONTINUE;
        END IF;
        -- 6. A reaction already as asked appends nothing; a 21st emoji on.
        IF k.kind = 'reaction' THEN
            IF (c_has AND c_on = k.on_) OR (NOT c_has AND NOT k.on_) THEN
                a_code[k.i] := 'OK'; a_seq[k.i] := c_sseq; a_dup[k.i] := false; a_chg[k.i] := false;
                a_ep[k.i] := k.epoch;
                CONTINUE;
            END IF;
            IF k.on_ AND c_cnt >= 20 THEN
                a_code[k.i] := 'TOO_MANY_EMOJI';
                CONTINUE;
            END IF;
        END IF;
        -- 7. A new event: the next seq of its conversation.
        a_new[k.i] := true;
        key_new[k.i] := k.i;
        a_conv[k.i] := k.conv_at;
        a_cnt0[k.i] := k.msg_count;
        conv_next[k.conv_at] := k.next_seq;
        a_seq[k.i] := k.next_seq + conv_n[k.conv_at];
        conv_n[k.conv_at] := conv_n[k.conv_at] + 1;
        a_code[k.i] := 'OK'; a_dup[k.i] := false; a_chg[k.i] := true; a_ep[k.i] := k.epoch;
        IF k.kind = 'reaction' THEN
            st_has[k.i] := true; st_on[k.i] := k.on_; st_seq[k.i] := a_seq[k.i];
            on_cnt[k.i] := c_cnt + CASE WHEN k.on_ THEN 1 ELSE -1 END;
        END IF;
    END LOOP;
    IF 0 < ANY (conv_n) THEN
        -- 2. The counters (the rows are the caller's: the seqs are ours).
        UPDATE conversations cv SET next_seq = cv.next_seq + a.n
          FROM (SELECT p_convs[x] AS conv, conv_n[x] AS n FROM generate_subscripts(conv_n, 1) x WHERE conv_n[x] > 0) a
         WHERE cv.conv_id = a.conv AND cv.conv_id = ANY (p_convs); -- the ANY: an index probe (im_send's UPDATE)
        -- 3. The events, then the aggregates the reads show (schema/012,
        --    schema/018), each one statement for the stretch.
        INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, target_seq, emoji,
                            react_on, epoch, msg_ordinal, created_at)
        SELECT p_convs[u.g], u.seq, u.kind, p_users[u.g], u.cmid, u.fp, CASE WHEN u.kind = 'edit' THEN u.body END,
               u.target, CASE WHEN u.kind = 'reaction' THEN u.emoji END,
               CASE WHEN u.kind = 'reaction' THEN u.on_ END, u.ep, u.cnt0, v_now
          FROM unnest(p_runs, p_kinds, p_cmids, p_targets, p_bodies, p_emojis, p_ons, a_new, a_seq, a_fp, a_ep, a_cnt0)
               AS u(g, kind, cmid, target, body, emoji, on_, new, seq, fp, ep, cnt0)
         WHERE u.new;
        -- The winning edit of each target: the stretch's last (highest seq).
        INSERT INTO msg_changes AS x (conv_id, seq, edit_seq, edit_body, edit_at)
        SELECT DISTINCT ON (p_convs[u.g], u.target) p_convs[u.g], u.target, u.seq, u.body, v_now
          FROM unnest(p_runs, p_kinds, p_targets, p_bodies, a_new, a_seq) AS u(g, kind, target, body, new, seq)
         WHERE u.new AND u.kind = 'edit'
         ORDER BY p_convs[u.g], u.target, u.seq DESC
        ON CONFLICT (conv_id, seq) DO UPDATE
           SET edit_seq = EXCLUDED.edit_seq, edit_body = EXCLUDED.edit_body, edit_at = EXCLUDED.edit_at;
        -- Each (target, user, emoji)'s state: its last event's.
        INSERT INTO reaction_state AS s (conv_id, target_seq, user_id, emoji, is_on, seq)
        SELECT DISTINCT ON (p_convs[u.g], u.target, p_users[u.g], u.emoji)
               p_convs[u.g], u.target, p_users[u.g], u.emoji, u.on_, u.seq
          FROM unnest(p_runs, p_kinds, p_targets, p_emojis, p_ons, a_new, a_seq)
               AS u(g, kind, target, emoji, on_, new, seq)
         WHERE u.new AND u.kind = 'reaction'
         ORDER BY p_convs[u.g], u.target, p_users[u.g], u.emoji, u.seq DESC
        ON CONFLICT (conv_id, target_seq, user_id, emoji) DO UPDATE SET is_on = EXCLUDED.is_on, seq = EXCLUDED.seq;
        -- The counts: each event +1 (on) or -1 (off), summed per (target,
        -- emoji): added to a row there is, else a new row (its first event
        -- turned the emoji on, so its sum is not negative). Not an upsert:
        -- the row's CHECK (count >= 0) would judge a negative sum as the
        -- row to insert. The conversation's row lock keeps other writers of
        -- these rows out between the two.
        WITH d AS (
            SELECT p_convs[u.g] AS conv, u.target, u.emoji, sum(CASE WHEN u.on_ THEN 1 ELSE -1 END) AS delta
              FROM unnest(p_runs, p_kinds, p_targets, p_emojis, p_ons, a_new) AS u(g, kind, target, emoji, on_, new)
             WHERE u.new AND u.kind = 'reaction'
             GROUP BY p_convs[u.g], u.target, u.emoji),
        up AS (
            UPDATE reaction_counts c SET count = c.count + d.delta
              FROM d WHERE c.conv_id = d.conv AND c.target_seq = d.target AND c.emoji = d.emoji
            RETURNING c.conv_id, c.target_seq, c.emoji)
        INSERT INTO reaction_counts (conv_id, target_seq, emoji, count)
        SELECT d.conv, d.target, d.emoji, d.delta FROM d
         WHERE NOT EXISTS (SELECT 1 FROM up WHERE up.conv_id = d.conv AND up.target_seq = d.target
                                                AND up.emoji = d.emoji);
        -- The summary a page shows (schema/018): per target the top 20 of
        -- the counts just written and its newest reaction's seq.
        INSERT INTO msg_changes AS x (conv_id, seq, reactions_seq, reactions_top)
        SELECT w.conv, w.target, w.hi,
               (SELECT json_agg(json_build_array(tp.emoji, tp.count) ORDER BY tp.count DESC, tp.emoji COLLATE "C")::text
                  FROM (SELECT c.emoji, c.count FROM reaction_counts c
                         WHERE c.conv_id = w.conv AND c.target_seq = w.target AND c.count > 0
                         ORDER BY c.count DESC, c.emoji COLLATE "C" LIMIT 20) tp)
          FROM (SELECT p_convs[u.g] AS conv, u.target, max(u.seq) AS hi
                  FROM unnest(p_runs, p_kinds, p_targets, a_new, a_seq) AS u(g, kind, target, new, seq)
                 WHERE u.new AND u.kind = 'reaction'
                 GROUP BY p_convs[u.g], u.target) w
        ON CONFLICT (conv_id, seq) DO UPDATE SET reactions_seq = EXCLUDED.reactions_seq,
                                                 reactions_top = EXCLUDED.reactions_top;
    END IF;
    RETURN QUERY
        SELECT u.i::integer, u.code, u.seq, u.dup, u.chg, u.ep
          FROM unnest(a_code, a_seq, a_dup, a_chg, a_ep) WITH ORDINALITY AS u(code, seq, dup, chg, ep, i)
         ORDER BY u.i;
END
$$;

CREATE OR REPLACE FUNCTION im_change(p_kind text, p_device text, p_token_sha256 text, p_conv text, p_user text,
                                     p_cmid text, p_target bigint, p_body text, p_emoji text, p_on boolean)
RETURNS TABLE (r_code text, r_seq bigint, r_dup boolean, r_changed boolean, r_epoch bigint)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_kind NOT IN ('edit', 'reaction') THEN
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
    -- 1. The row lock (waited for: a lone request, not a group's).
    PERFORM 1 FROM conversations c WHERE c.conv_id = p_conv FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'NOT_MEMBER'::text, NULL::bigint, NULL::boolean, NULL::boolean, NULL::bigint;
        RETURN;
    END IF;
    -- 2-7. The checks and the writes: im_change_items, as for a group's.
    RETURN QUERY SELECT c.r_code, c.r_seq, c.r_dup, c.r_changed, c.r_epoch
                   FROM im_change_items(ARRAY[NULL::text], ARRAY[p_conv], ARRAY[p_user], ARRAY[1], ARRAY[p_kind],
                                        ARRAY[p_cmid], ARRAY[p_target], ARRAY[p_body], ARRAY[p_emoji], ARRAY[p_on]) c;
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
-- of im_send, a stretch of consecutive edits and reacts by one call of
-- im_change_items (set-based, function set 8; before, one im_change per
-- item), all in this transaction under the conversation's row lock. So an edit or react sees
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
    codes  text[] := array_fill(NULL::text, ARRAY[nr]);         -- im_lock_runs' answer per run (NULL: ours)
    a_code text[] := array_fill(NULL::text, ARRAY[n]);
    a_seq  bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_mid  text[] := array_fill(NULL::text, ARRAY[n]);
    a_ep   bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_dup  boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    a_ts   bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_att  text[] := array_fill(NULL::text, ARRAY[n]);
    a_chg  boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    seg    integer[];                                          -- the items of one stretch (sends, or changes)
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
        codes[k.r_run] := k.r_code;
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
            -- A stretch of consecutive edits and reacts: one call of
            -- im_change_items (the locks are this transaction's, above).
            seg := ARRAY[]::integer[];
            WHILE ix <= n AND p_kinds[ix] <> 'msg' LOOP
                IF held[p_runs[ix]] THEN a_code[ix] := 'LOCKED'; ELSE seg := seg || ix; END IF;
                ix := ix + 1;
            END LOOP;
            FOR k IN
                SELECT c.r_item, c.r_code, c.r_seq, c.r_dup, c.r_changed, c.r_epoch
                  FROM im_change_items(codes, p_convs, p_users,
                               ARRAY(SELECT p_runs[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT p_kinds[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT p_cmids[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT p_targets[x.i] FROM unnest(seg) WITH ORDINALITY AS x(i, o) ORDER BY x.o),
                               ARRAY(SELECT coalesce(p_bodies[x.i], '') FROM unnest(seg) WITH ORDINALITY AS x(i, o)
                                      ORDER BY x.o),
                               ARRAY(SELECT coalesce(p_emojis[x.i], '') FROM unnest(seg) WITH ORDINALITY AS x(i, o)
                                      ORDER BY x.o),
                               ARRAY(SELECT coalesce(p_ons[x.i], false) FROM unnest(seg) WITH ORDINALITY AS x(i, o)
                                      ORDER BY x.o)) c
            LOOP
                a_code[seg[k.r_item]] := k.r_code; a_seq[seg[k.r_item]] := k.r_seq;
                a_dup[seg[k.r_item]] := k.r_dup; a_chg[seg[k.r_item]] := k.r_changed; a_ep[seg[k.r_item]] := k.r_epoch;
            END LOOP;
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
