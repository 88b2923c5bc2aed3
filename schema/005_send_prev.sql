-- im_send (004) with the order guard of pipelined sends. Each send may name
-- `prev`: the cmid of the caller's previous message in this conversation.
-- Such a send is appended only if that message is committed (its event, or
-- the tombstone retention left for it); otherwise it is answered UNAVAILABLE
-- and nothing is written. So a client that puts several sends of one
-- conversation on the wire at once never sees a later one committed ahead of
-- an earlier one that failed (docs/protocol.md, "Send": order of pipelined
-- sends). The check comes after the request key (a resend of a committed
-- message is its duplicate, whatever `prev`), the tombstone and the open
-- period (NOT_MEMBER stays final), right before the append.
-- The lab's negative control of the guard: im.lab_broken containing
-- send_prev (fault point rule.send_prev) skips it.
-- The signature gains p_prevs (NULL entries: no prev); the old one is dropped.
DROP FUNCTION im_send(text, text, text[], text[], boolean);
CREATE FUNCTION im_send(p_conv text, p_user text, p_cmids text[], p_bodies text[], p_prevs text[], p_lock boolean)
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
    -- The lab's broken rules for this transaction (its negative controls):
    -- empty unless a gateway started with --enable-faults armed a rule.*
    -- point of the send path and set im.lab_broken (set_config, local).
    broken text[] := string_to_array(coalesce(current_setting('im.lab_broken', true), ''), ',');
BEGIN
    -- 0. Without any lock: the caller has (or had) a period here. A stranger,
    --    or a probe of an unknown conversation, never waits on its row lock.
    IF NOT EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = p_conv AND m.user_id = p_user)
       AND NOT 'send_membership' = ANY (broken) THEN
        FOR i IN 1..n LOOP
            r_item := i;
            -- (control same_error: an unknown conversation answered apart)
            r_code := CASE WHEN 'same_error' = ANY (broken)
                                AND NOT EXISTS (SELECT 1 FROM conversations cv WHERE cv.conv_id = p_conv)
                           THEN 'NO_SUCH_CONV' ELSE 'NOT_MEMBER' END;
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
            IF k.request_hash = fp OR 'request_hash' = ANY (broken) THEN
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
                        WHERE m.conv_id = p_conv AND m.user_id = p_user AND m.to_seq IS NULL)
           AND NOT 'send_membership' = ANY (broken) THEN
            r_code := 'NOT_MEMBER';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 4a. Pipelined order: the message named by `prev` is committed (or
        --     was, and retention left its tombstone); else nothing is written.
        IF p_prevs[i] IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM events e
                            WHERE e.conv_id = p_conv AND e.sender_user = p_user AND e.client_msg_id = p_prevs[i])
           AND NOT EXISTS (SELECT 1 FROM idem_tombstones t
                            WHERE t.conv_id = p_conv AND t.sender_user = p_user AND t.client_msg_id = p_prevs[i])
           AND NOT 'send_prev' = ANY (broken) THEN
            r_code := 'PREV_NOT_COMMITTED';
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
        r_code := 'OK'; r_seq := v_seq; r_epoch := v_ep; r_dup := 'fresh_dup' = ANY (broken);
        RETURN NEXT;
    END LOOP;
END
$$;
