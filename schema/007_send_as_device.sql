-- A revoked device writes nothing more (contract section 4). im_send (006)
-- gains the sending device: its row, as proved at hello (device id and
-- token hash), not revoked, is taken FOR SHARE in the same statement as the
-- conversation's row lock (steps 0 and 1), and held until COMMIT.
--   * A revocation or a new token (an UPDATE of that row, admin CLI) waits
--     for every send transaction of the device already holding it: those
--     committed before the revocation, and their answers are true.
--   * A send that comes after the revocation committed finds no valid row
--     (FOR SHARE re-reads the newest version of a row it waited for): each
--     item gets UNAUTHENTICATED and nothing is written.
-- Share locks do not conflict with each other, so sends of one device on
-- several connections never wait for one another here; a device row is
-- written only by hello (its install), a revocation or a new token, none of
-- which holds a conversation's row. The check costs no statement of its own
-- (a wrapper function around im_send measured 20 % fewer lone sends per
-- second, docs/benchmarks.md): the old signature is dropped, not wrapped.
-- Everything else is 006 unchanged (an applied migration is never edited,
-- and PostgreSQL redefines a function only whole).
DROP FUNCTION im_send(text, text, text[], text[], text[], boolean);

CREATE FUNCTION im_send(p_device text, p_token_sha256 text, p_conv text, p_user text, p_cmids text[], p_bodies text[],
                        p_prevs text[], p_lock boolean)
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
    -- The lab's broken rules for this transaction (its negative controls):
    -- empty unless a gateway started with --enable-faults armed a rule.*
    -- point of the send path and set im.lab_broken (set_config, local).
    broken text[] := string_to_array(coalesce(current_setting('im.lab_broken', true), ''), ',');
BEGIN
    -- The sending device's row, held FOR SHARE until COMMIT: the device and
    -- token proved at hello, not revoked (contract section 4). A revocation
    -- or a new token (an UPDATE of that row) waits for this transaction; a
    -- send that comes after one committed finds no such row.
    -- 0. The caller has (or had) a period here: tested before the rows are
    --    locked (a filtered row is never locked), so a stranger, or a probe
    --    of an unknown conversation, never waits on the row lock.
    -- 1. The conversation row lock: per-conversation seq order = commit order.
    --    (The lab's negative control runs without it.)
    -- One statement for all three.
    IF p_lock THEN
        SELECT cv.next_seq, cv.msg_count, cv.epoch INTO v_next, v_cnt, v_ep
          FROM conversations cv, devices d
         WHERE cv.conv_id = p_conv
           AND d.device_id = p_device AND d.user_id = p_user
           AND d.token_sha256 = decode(p_token_sha256, 'hex') AND d.revoked_at IS NULL
           AND ('send_membership' = ANY (broken)
                OR EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = p_conv AND m.user_id = p_user))
           FOR UPDATE OF cv FOR SHARE OF d;
    ELSE
        SELECT cv.next_seq, cv.msg_count, cv.epoch INTO v_next, v_cnt, v_ep
          FROM conversations cv, devices d
         WHERE cv.conv_id = p_conv
           AND d.device_id = p_device AND d.user_id = p_user
           AND d.token_sha256 = decode(p_token_sha256, 'hex') AND d.revoked_at IS NULL
           AND ('send_membership' = ANY (broken)
                OR EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = p_conv AND m.user_id = p_user))
           FOR SHARE OF d;
    END IF;
    IF NOT FOUND THEN
        -- Which of the two failed: the device's access, or the conversation
        -- (C4: unknown and not a member answer alike).
        IF NOT EXISTS (SELECT 1 FROM devices d
                        WHERE d.device_id = p_device AND d.user_id = p_user
                          AND d.token_sha256 = decode(p_token_sha256, 'hex') AND d.revoked_at IS NULL) THEN
            v_code := 'UNAUTHENTICATED';
        ELSIF 'same_error' = ANY (broken) AND NOT EXISTS (SELECT 1 FROM conversations cv WHERE cv.conv_id = p_conv) THEN
            v_code := 'NO_SUCH_CONV'; -- (control same_error: an unknown conversation answered apart)
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
            IF k.request_hash = fp OR 'request_hash' = ANY (broken) THEN
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
        IF NOT k.open AND NOT 'send_membership' = ANY (broken) THEN
            r_code := 'NOT_MEMBER';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 4a. Pipelined order: the message named by `prev` is committed (or
        --     was, and retention left its tombstone); else nothing is written.
        IF NOT k.prev_ok AND NOT 'send_prev' = ANY (broken) THEN
            r_code := 'PREV_NOT_COMMITTED';
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- 5. Take the seq, insert the row with its running counts for `unread`.
        IF p_lock THEN
            v_seq := v_next;
            v_next := v_next + 1;
            v_cnt := v_cnt + 1;
        ELSE
            UPDATE conversations cv SET next_seq = cv.next_seq + 1, msg_count = cv.msg_count + 1
             WHERE cv.conv_id = p_conv
            RETURNING cv.next_seq - 1, cv.msg_count, cv.epoch INTO v_seq, v_cnt, v_ep;
        END IF;
        INSERT INTO events AS e (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, epoch,
                                 msg_ordinal, sender_ordinal)
        VALUES (p_conv, v_seq, 'msg', p_user, p_cmids[i], fp, p_bodies[i], v_ep, v_cnt,
                coalesce(v_ord, (SELECT p.sender_ordinal FROM events p
                                  WHERE p.conv_id = p_conv AND p.sender_user = p_user AND p.kind = 'msg'
                                  ORDER BY p.seq DESC LIMIT 1), 0) + 1)
        RETURNING e.mid::text, floor(extract(epoch FROM e.created_at) * 1000)::bigint, e.sender_ordinal
             INTO r_mid, r_ts, v_ord;
        added := added + 1;
        r_code := 'OK'; r_seq := v_seq; r_epoch := v_ep; r_dup := 'fresh_dup' = ANY (broken);
        RETURN NEXT;
    END LOOP;
    -- The counters, written back once.
    IF p_lock AND added > 0 THEN
        UPDATE conversations cv SET next_seq = v_next, msg_count = v_cnt WHERE cv.conv_id = p_conv;
    END IF;
END
$$;
