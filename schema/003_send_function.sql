-- send's check-and-append as one server-side call: a send, or a pipelined
-- run of sends of one connection to one conversation, is one round trip
-- (contract section 6, steps 0-5, in that order). Each item is judged on its
-- own, in order, exactly as a lone send; the caller commits (autocommit).
--
-- One row per item: r_code is 'OK' (r_dup says whether it is the original's
-- reply) or the contract's error code.
CREATE FUNCTION im_send(p_conv text, p_user text, p_cmids text[], p_bodies text[], p_lock boolean)
RETURNS TABLE (r_item integer, r_code text, r_seq bigint, r_mid text, r_epoch bigint, r_dup boolean, r_ts bigint)
LANGUAGE plpgsql AS $$
DECLARE
    n     integer := coalesce(array_length(p_cmids, 1), 0);
    c     record;
    k     record;
    fp    bytea;
    v_seq bigint;
    v_cnt bigint;
    v_ep  bigint;
BEGIN
    -- 0. Without any lock: the caller has (or had) a period here. A stranger,
    --    or a probe of an unknown conversation, never waits on its row lock.
    IF NOT EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = p_conv AND m.user_id = p_user) THEN
        FOR i IN 1..n LOOP
            r_item := i; r_code := 'NOT_MEMBER';
            RETURN NEXT;
        END LOOP;
        RETURN;
    END IF;
    -- 1. The conversation row lock: per-conversation seq order = commit order.
    --    (The lab's negative control runs without it.)
    IF p_lock THEN
        SELECT cv.conv_id INTO c FROM conversations cv WHERE cv.conv_id = p_conv FOR UPDATE;
    ELSE
        SELECT cv.conv_id INTO c FROM conversations cv WHERE cv.conv_id = p_conv;
    END IF;
    IF NOT FOUND THEN
        FOR i IN 1..n LOOP
            r_item := i; r_code := 'NOT_MEMBER';
            RETURN NEXT;
        END LOOP;
        RETURN;
    END IF;
    FOR i IN 1..n LOOP
        r_item := i; r_code := NULL; r_seq := NULL; r_mid := NULL; r_epoch := NULL; r_dup := NULL; r_ts := NULL;
        fp := sha256(convert_to(p_conv, 'UTF8') || '\x00'::bytea || convert_to(p_bodies[i], 'UTF8'));
        -- 2. The request key: same fingerprint -> the original; else a mismatch.
        SELECT e.seq, e.mid::text AS mid, e.epoch, e.request_hash,
               floor(extract(epoch FROM e.created_at) * 1000)::bigint AS ts
          INTO k FROM events e
         WHERE e.conv_id = p_conv AND e.sender_user = p_user AND e.client_msg_id = p_cmids[i]
         ORDER BY e.seq LIMIT 1;
        IF FOUND THEN
            IF k.request_hash = fp THEN
                r_code := 'OK'; r_seq := k.seq; r_mid := k.mid; r_epoch := k.epoch; r_dup := true; r_ts := k.ts;
            ELSE
                r_code := 'IDEMPOTENCY_MISMATCH';
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 3. A tombstone: the original ran, but retention purged it.
        IF EXISTS (SELECT 1 FROM idem_tombstones t
                    WHERE t.conv_id = p_conv AND t.sender_user = p_user AND t.client_msg_id = p_cmids[i]) THEN
            r_code := 'ORIGINAL_EXPIRED';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 4. Write access needs an open period.
        IF NOT EXISTS (SELECT 1 FROM membership_periods m
                        WHERE m.conv_id = p_conv AND m.user_id = p_user AND m.to_seq IS NULL) THEN
            r_code := 'NOT_MEMBER';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 5. Take the seq, insert the row with its running counts for `unread`.
        UPDATE conversations cv SET next_seq = cv.next_seq + 1, msg_count = cv.msg_count + 1
         WHERE cv.conv_id = p_conv
        RETURNING cv.next_seq - 1, cv.msg_count, cv.epoch INTO v_seq, v_cnt, v_ep;
        INSERT INTO events AS e (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, epoch,
                                 msg_ordinal, sender_ordinal)
        VALUES (p_conv, v_seq, 'msg', p_user, p_cmids[i], fp, p_bodies[i], v_ep, v_cnt,
                coalesce((SELECT p.sender_ordinal FROM events p
                           WHERE p.conv_id = p_conv AND p.sender_user = p_user AND p.kind = 'msg'
                           ORDER BY p.seq DESC LIMIT 1), 0) + 1)
        RETURNING e.mid::text, floor(extract(epoch FROM e.created_at) * 1000)::bigint INTO r_mid, r_ts;
        r_code := 'OK'; r_seq := v_seq; r_epoch := v_ep; r_dup := false;
        RETURN NEXT;
    END LOOP;
END
$$;
