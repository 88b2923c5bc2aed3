-- im_send: contract section 6, steps 0-5 of a send, as one server-side call,
-- so a send, or a pipelined run of sends of one connection to one
-- conversation, is one round trip. Each item is judged on its own, in order,
-- exactly as a lone send; the caller commits (autocommit, or a group
-- statement of several calls: server/src/store.cpp, Store::send_runs).
--
-- This is the only definition of im_send: the server applies this file with
-- CREATE OR REPLACE whenever its checksum differs from the one recorded in
-- schema_functions (docs/operations.md, "Schema"). It carries no lab switch:
-- nothing here reads a session setting. The acceptance lab's broken variants
-- are separate functions, derived from this text and installed only into a
-- database the lab created (server/src/lab_schema.cpp, docs/acceptance.md).
--
-- One row per item: r_code is 'OK' (r_dup says whether it is the original's
-- reply), the contract's error code, UNAUTHENTICATED (the device lost its
-- access), PREV_NOT_COMMITTED, or LOCKED: another transaction holds the
-- conversation's row, nothing was written, and the caller runs the items
-- again later (a held conversation never stalls a send worker).
--
-- The sending device's row is held FOR SHARE until COMMIT: the device and
-- token proved at hello, not revoked (contract section 4). A revocation or a
-- new token (an UPDATE of that row, admin CLI) waits for every send
-- transaction of the device already holding it; a send that comes after one
-- committed finds no valid row (FOR SHARE re-reads the newest version of a
-- row it waited for) and every item gets UNAUTHENTICATED. Share locks do not
-- conflict with each other, so sends of one device on several connections
-- never wait for one another here.
CREATE OR REPLACE FUNCTION im_send(p_device text, p_token_sha256 text, p_conv text, p_user text, p_cmids text[],
                                   p_bodies text[], p_prevs text[])
RETURNS TABLE (r_item integer, r_code text, r_seq bigint, r_mid text, r_epoch bigint, r_dup boolean, r_ts bigint)
LANGUAGE plpgsql AS $$
DECLARE
    n      integer := coalesce(array_length(p_cmids, 1), 0);
    k      record;
    fp     bytea;
    v_next bigint;          -- the next seq to hand out
    v_cnt  bigint;          -- msg events in the conversation so far
    v_ep   bigint;
    v_ord  bigint;          -- the caller's own msg events so far (NULL: not read yet)
    v_seq  bigint;
    added  integer := 0;
    v_code text;
BEGIN
    -- 0. The caller has (or had) a period here: tested before the rows are
    --    locked (a filtered row is never locked), so a stranger, or a probe
    --    of an unknown conversation, never waits on the row lock.
    -- 1. The conversation row lock: per-conversation seq order = commit
    --    order. A row another transaction holds is skipped, not waited for.
    -- The device's row with them: one statement for all three.
    SELECT cv.next_seq, cv.msg_count, cv.epoch INTO v_next, v_cnt, v_ep
      FROM conversations cv, devices d
     WHERE cv.conv_id = p_conv
       AND d.device_id = p_device AND d.user_id = p_user
       AND d.token_sha256 = decode(p_token_sha256, 'hex') AND d.revoked_at IS NULL
       AND EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = p_conv AND m.user_id = p_user)
       FOR UPDATE OF cv SKIP LOCKED FOR SHARE OF d;
    IF NOT FOUND THEN
        -- Which one failed: the device's access, the conversation (C4:
        -- unknown and not a member answer alike), or its row was held.
        IF NOT EXISTS (SELECT 1 FROM devices d
                        WHERE d.device_id = p_device AND d.user_id = p_user
                          AND d.token_sha256 = decode(p_token_sha256, 'hex') AND d.revoked_at IS NULL) THEN
            v_code := 'UNAUTHENTICATED';
        ELSIF EXISTS (SELECT 1 FROM conversations cv WHERE cv.conv_id = p_conv)
              AND EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = p_conv AND m.user_id = p_user) THEN
            v_code := 'LOCKED';
        ELSE
            v_code := 'NOT_MEMBER';
        END IF;
        FOR i IN 1..n LOOP
            r_item := i;
            r_code := v_code;
            RETURN NEXT;
        END LOOP;
        RETURN;
    END IF;
    FOR i IN 1..n LOOP
        r_item := i; r_code := NULL; r_seq := NULL; r_mid := NULL; r_epoch := NULL; r_dup := NULL; r_ts := NULL;
        fp := sha256(convert_to(p_conv, 'UTF8') || '\x00'::bytea || convert_to(p_bodies[i], 'UTF8'));
        -- Steps 2-4a read in one statement, judged below in their order.
        SELECT o.seq, o.mid, o.epoch, o.request_hash, o.ts,
               EXISTS (SELECT 1 FROM idem_tombstones t
                        WHERE t.conv_id = p_conv AND t.sender_user = p_user AND t.client_msg_id = p_cmids[i]) AS tomb,
               EXISTS (SELECT 1 FROM membership_periods m
                        WHERE m.conv_id = p_conv AND m.user_id = p_user AND m.to_seq IS NULL) AS open,
               (p_prevs[i] IS NULL
                OR EXISTS (SELECT 1 FROM events e
                            WHERE e.conv_id = p_conv AND e.sender_user = p_user AND e.client_msg_id = p_prevs[i])
                OR EXISTS (SELECT 1 FROM idem_tombstones t
                            WHERE t.conv_id = p_conv AND t.sender_user = p_user AND t.client_msg_id = p_prevs[i]))
                  AS prev_ok
          INTO k
          FROM (SELECT 1) one
          LEFT JOIN LATERAL (
                -- OFFSET 0 plans the key's lookup on its own: through the
                -- request-key index. Without the fence the generic plan may
                -- serve ORDER BY seq from the primary key instead, reading
                -- the whole conversation for a key that is not there (every
                -- fresh send): quadratic in a long flush.
                SELECT * FROM (
                    SELECT e.seq, e.mid::text AS mid, e.epoch, e.request_hash,
                           floor(extract(epoch FROM e.created_at) * 1000)::bigint AS ts
                      FROM events e
                     WHERE e.conv_id = p_conv AND e.sender_user = p_user AND e.client_msg_id = p_cmids[i]
                    OFFSET 0) found
                 ORDER BY found.seq LIMIT 1) o ON true;
        -- 2. The request key: same fingerprint -> the original; else a mismatch.
        IF k.seq IS NOT NULL THEN
            IF k.request_hash = fp THEN
                r_code := 'OK'; r_seq := k.seq; r_mid := k.mid; r_epoch := k.epoch; r_dup := true; r_ts := k.ts;
            ELSE
                r_code := 'IDEMPOTENCY_MISMATCH';
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 3. A tombstone: the original ran, but retention purged it.
        IF k.tomb THEN
            r_code := 'ORIGINAL_EXPIRED';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 4. Write access needs an open period.
        IF NOT k.open THEN
            r_code := 'NOT_MEMBER';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 4a. Pipelined order: the message named by `prev` is committed (or
        --     was, and retention left its tombstone); else nothing is written.
        IF NOT k.prev_ok THEN
            r_code := 'PREV_NOT_COMMITTED';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 5. Take the seq, insert the row with its running counts for `unread`.
        v_seq := v_next; v_next := v_next + 1; v_cnt := v_cnt + 1;
        INSERT INTO events AS e (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, epoch,
                                 msg_ordinal, sender_ordinal)
        VALUES (p_conv, v_seq, 'msg', p_user, p_cmids[i], fp, p_bodies[i], v_ep, v_cnt,
                coalesce(v_ord, (SELECT p.sender_ordinal FROM events p
                                  WHERE p.conv_id = p_conv AND p.sender_user = p_user AND p.kind = 'msg'
                                  ORDER BY p.seq DESC LIMIT 1), 0) + 1)
        RETURNING e.mid::text, floor(extract(epoch FROM e.created_at) * 1000)::bigint, e.sender_ordinal
             INTO r_mid, r_ts, v_ord;
        added := added + 1;
        r_code := 'OK'; r_seq := v_seq; r_epoch := v_ep; r_dup := false;
        RETURN NEXT;
    END LOOP;
    -- The counters, written back once.
    IF added > 0 THEN
        UPDATE conversations cv SET next_seq = v_next, msg_count = v_cnt WHERE cv.conv_id = p_conv;
    END IF;
END
$$;
