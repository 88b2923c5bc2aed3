-- im_send: contract section 6, steps 0-5 of a send, for a whole group of
-- runs in one server-side call: one statement, one round trip, one commit
-- per group (server/src/store/store.cpp, Store::send_group; a lone run is a group
-- of one, Store::send_run). A run is the pipelined sends of one connection
-- to one conversation: run g has p_devices[g], p_token_sha256s[g] (hex),
-- p_convs[g] and p_users[g]; item i belongs to run p_runs[i] (ascending) and
-- carries p_cmids[i], p_bodies[i], p_prevs[i] (NULL: no prev) and
-- p_reply_tos[i] (NULL: not a reply; contract section 12) and p_atts[i]
-- (NULL: no attachments; else the att_ids in the order given, joined by
-- ',', each a canonical lowercase UUID: the gateway's codec checked them). Each item is
-- judged on its own, in order (run by run, item by item), exactly as a lone
-- send; the caller commits (autocommit: the call is the transaction).
--
-- Set-based: whatever the group's size, the work is a fixed number of
-- statements: (1) one locking select of all its conversations, (2) one
-- lookup of every item's request key, tombstone and `prev` (a join against
-- unnest of the group's arrays), then the checks in memory (no statement),
-- (3) one counter update per conversation (a single UPDATE) that also hands
-- out the bases of the new seqs, (4) one INSERT ... SELECT of the new events.
--
-- This is the only definition of im_send: the server applies this file with
-- CREATE OR REPLACE, as a part of the versioned set of schema/functions (a
-- change here is a new version in versions.txt), never over a newer set
-- (docs/operations.md, "The function set's version"). It carries no lab switch:
-- nothing here reads a session setting. The acceptance lab's broken variants
-- are separate functions, derived from this text and installed only into a
-- database the lab created (server/src/store/lab_schema.cpp, docs/acceptance.md).
--
-- One row per item, in item order: r_run, r_item (the item's index in the
-- group), r_code: 'OK' (r_dup says whether it is the original's reply), the
-- contract's error code, UNAUTHENTICATED (the device lost its access),
-- PREV_NOT_COMMITTED, NOT_FOUND (reply_to, or an attachment that is not a
-- complete upload of the sender's user), MUTED (schema/015), or LOCKED: another transaction holds the run's
-- conversation row, nothing of that run was written, and the caller runs it
-- again later (a held conversation never stalls a send worker): through
-- im_send_queued (schema/functions/im_send_queued.sql), which waits for the
-- row in its lock queue first and then calls this function.
--
-- The row is locked FOR NO KEY UPDATE: a send changes no key of it, and
-- FOR UPDATE would also collide with the FOR KEY SHARE that every insert
-- referencing the conversation takes (a first ack or read marker, a
-- member added).
--
-- The sending device's row is held FOR SHARE until COMMIT: the device and
-- token proved at hello, not revoked (contract section 4). A revocation or a
-- new token (an UPDATE of that row, admin CLI) waits for every send
-- transaction of the device already holding it; a send that comes after one
-- committed finds no valid row (FOR SHARE re-reads the newest version of a
-- row it waited for) and every item of the run gets UNAUTHENTICATED. Share
-- locks do not conflict with each other, so sends of one device on several
-- connections never wait for one another here. Before the rows, the gate of
-- each device is taken shared, in device order (schema/functions/
-- im_device_gate.sql): a revocation waiting for the row is then never
-- starved by the device's next sends, and a send that waited at the gate
-- reads the device's row after the revocation committed.

--
-- p_channel: when not empty, the notification of the group's events
-- (contract section 7) goes out with this transaction, pg_notify on that
-- channel, one payload per conversation ('e CONV HIGH [LOW]', as
-- PgBus::collapse writes them): PostgreSQL delivers it at COMMIT or never,
-- so the reply waits for one transaction, not for a second one of the bus
-- (--notify-in-commit, docs/operations.md). Empty: the caller publishes
-- after COMMIT (the NATS bus, or --notify-in-commit off). A duplicate is
-- announced again, as the bus's publish-after-commit does: its original may
-- have been committed by a gateway that died before it published.

-- im_lock_runs: the locks of a group of runs, and the answer of each run
-- whose conversation is not this transaction's. The ONE place of the write
-- path's lock-taking: im_send (below) and im_write_group
-- (schema/functions/im_change.sql) both start with it, so their order of
-- locks, their SKIP LOCKED and their answer for a held row cannot drift
-- apart. Per run g (p_devices[g], p_token_sha256s[g], p_convs[g],
-- p_users[g]) one row: r_run = g; r_code NULL when the run's conversation
-- row and gate are now this transaction's (r_epoch its epoch), else
-- UNAUTHENTICATED (the device lost its access), LOCKED (a member with a
-- valid device, but another transaction holds the row or the gate: the
-- caller runs it again later) or NOT_MEMBER (no period, or no such
-- conversation: C4 answers them alike).
--
-- In this order (im_send_lock, schema/functions/im_send_queued.sql, waits
-- for the same locks in the same order):
CREATE OR REPLACE FUNCTION im_lock_runs(p_devices text[], p_token_sha256s text[], p_convs text[], p_users text[])
RETURNS TABLE (r_run integer, r_code text, r_epoch bigint)
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
DECLARE
    nr       integer := coalesce(array_length(p_convs, 1), 0);
    k        record;
    run_code text[] := array_fill(NULL::text, ARRAY[nr]);
    run_lock boolean[] := array_fill(false, ARRAY[nr]);
    run_ep   bigint[] := array_fill(NULL::bigint, ARRAY[nr]);
BEGIN
    -- 0. The caller has (or had) a period here: tested before the rows are
    --    locked (a filtered row is never locked), so a stranger, or a probe
    --    of an unknown conversation, never waits on the row lock.
    -- The devices' gates, shared (im_send's header, below), before this
    -- call's first snapshot of their rows.
    PERFORM pg_advisory_xact_lock_shared(im_device_gate_key(g.dev))
       FROM (SELECT DISTINCT dev FROM unnest(p_devices) AS dev ORDER BY dev) g;
    -- 1. The conversation rows, locked in conversation order: per-conversation
    --    seq order = commit order. A row another transaction holds is
    --    skipped, not waited for. The devices' rows with them. Then each
    --    locked row's conversation gate is tried (schema/functions/
    --    im_conv_gate.sql): held or waited for by another transaction, the
    --    run is left out as if its row were held (the row stays locked until
    --    this call commits: the gate's first waiter waits for this one
    --    statement, then has its turn). A gate or row this transaction holds
    --    already, im_send_queued's, is ours. (The gate is tried here, not in
    --    the query: a qual there would be evaluated before step 0's semi-join,
    --    or turn it into a subplan, and the plan was measured as is.)
    --    The membership test is a probe of (conv, user) per run (OFFSET 0
    --    keeps it a subplan): as a semi-join the generic plan reached it by
    --    the user alone and read every period of a user in many
    --    conversations (4,448 rows for one send of a user in 10,000).
    FOR k IN
        SELECT r.g::integer AS g, cv.epoch
          FROM unnest(p_devices, p_token_sha256s, p_convs, p_users) WITH ORDINALITY AS r(dev, tok, conv, usr, g)
          JOIN conversations cv ON cv.conv_id = r.conv
          JOIN devices d ON d.device_id = r.dev AND d.user_id = r.usr
                        AND d.token_sha256 = decode(r.tok, 'hex') AND d.revoked_at IS NULL
         WHERE EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = r.conv AND m.user_id = r.usr OFFSET 0)
         ORDER BY cv.conv_id
           FOR NO KEY UPDATE OF cv SKIP LOCKED FOR SHARE OF d
    LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(im_conv_gate_key(p_convs[k.g]));
        run_lock[k.g] := true;
        run_ep[k.g] := k.epoch;
    END LOOP;
    -- A run left out: which check failed, its device's access, the
    -- conversation (C4: unknown and not a member answer alike), or its row
    -- was held. Rare; a statement or two per such run.
    FOR g IN 1..nr LOOP
        CONTINUE WHEN run_lock[g];
        IF NOT EXISTS (SELECT 1 FROM devices d
                        WHERE d.device_id = p_devices[g] AND d.user_id = p_users[g]
                          AND d.token_sha256 = decode(p_token_sha256s[g], 'hex') AND d.revoked_at IS NULL) THEN
            run_code[g] := 'UNAUTHENTICATED';
        ELSIF EXISTS (SELECT 1 FROM conversations cv WHERE cv.conv_id = p_convs[g])
              AND EXISTS (SELECT 1 FROM membership_periods m WHERE m.conv_id = p_convs[g] AND m.user_id = p_users[g]) THEN
            run_code[g] := 'LOCKED';
        ELSE
            run_code[g] := 'NOT_MEMBER';
        END IF;
    END LOOP;
    RETURN QUERY SELECT g::integer, run_code[g], run_ep[g] FROM generate_series(1, nr) g;
END
$$;

-- The signature changed with the set-based rewrite (issue 28), again
-- with p_channel, again with p_reply_tos (contract v3) and again with p_atts and r_atts
-- (attachments: the list a msg event carries, as JSON, for the sender's gateway's pushes). The one-run im_send(text, text, text, text, text[],
-- text[], text[]) and the set-based im_send of eight arrays of the previous
-- releases (and the nine-argument one of the releases before v3) are NOT dropped here: in a database made before, they stay
-- callable for the previous releases' gateways during a rolling upgrade
-- (docs/operations.md, "Schema"); no gateway of this release calls them.

CREATE OR REPLACE FUNCTION im_send(p_devices text[], p_token_sha256s text[], p_convs text[], p_users text[],
                                   p_runs integer[], p_cmids text[], p_bodies text[], p_prevs text[],
                                   p_reply_tos bigint[], p_atts text[], p_channel text)
RETURNS TABLE (r_run integer, r_item integer, r_code text, r_seq bigint, r_mid text, r_epoch bigint, r_dup boolean,
               r_ts bigint, r_atts text)
-- Generic plans, planned once per connection. PL/pgSQL hands this
-- function's arrays and local variables to its statements as parameters;
-- under the default plan_cache_mode a custom plan sees them as constants,
-- estimates unnest() at its real size and so always looks cheaper than the
-- generic plan (100 rows): the key lookup (2) was replanned on two calls in
-- three, about as much planning as execution. The generic plans are as
-- good at 5 items and at 500 (docs/benchmarks.md, "Generic plans"), and the
-- setting also keeps an operator's own plan_cache_mode out of the send path.
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
DECLARE
    nr       integer := coalesce(array_length(p_convs, 1), 0);
    n        integer := coalesce(array_length(p_runs, 1), 0);
    -- One commit, one time for all the group's new events.
    v_now    timestamptz := clock_timestamp();
    v_ts     bigint := floor(extract(epoch FROM v_now) * 1000)::bigint;
    k        record;
    j        integer;
    -- per run
    run_code text[] := array_fill(NULL::text, ARRAY[nr]);      -- set: every item of the run answers it
    run_lock boolean[] := array_fill(false, ARRAY[nr]);        -- the conversation's row is ours
    run_ep   bigint[] := array_fill(NULL::bigint, ARRAY[nr]);
    -- per conversation and per (conversation, sender), indexed by the
    -- first run of the group that has it
    conv_n   integer[] := array_fill(0, ARRAY[nr]);            -- new events
    conv_seq bigint[] := array_fill(NULL::bigint, ARRAY[nr]);  -- the first new seq
    conv_cnt bigint[] := array_fill(NULL::bigint, ARRAY[nr]);  -- msg events before the new ones
    own_ord  bigint[] := array_fill(NULL::bigint, ARRAY[nr]);  -- the sender's last msg ordinal so far
    -- per item
    a_code   text[] := array_fill(NULL::text, ARRAY[n]);
    a_seq    bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_mid    text[] := array_fill(NULL::text, ARRAY[n]);
    a_ep     bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_dup    boolean[] := array_fill(NULL::boolean, ARRAY[n]);
    a_ts     bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    a_fp     bytea[] := array_fill(NULL::bytea, ARRAY[n]);
    a_att    jsonb[] := array_fill(NULL::jsonb, ARRAY[n]);     -- the attachments as the event carries them
    a_new    boolean[] := array_fill(false, ARRAY[n]);         -- inserted by this call
    a_conv   integer[] := array_fill(NULL::integer, ARRAY[n]); -- its conversation's index (conv_*)
    a_off    integer[] := array_fill(NULL::integer, ARRAY[n]); -- new: its place among its conversation's new events
    a_own    bigint[] := array_fill(NULL::bigint, ARRAY[n]);   -- new: its sender_ordinal
    a_src    integer[] := array_fill(NULL::integer, ARRAY[n]); -- a repeat of item a_src, new in this call
    key_new  integer[] := array_fill(NULL::integer, ARRAY[n]); -- the item new in this call with this item's key, up to it
BEGIN
    -- 0-1. The locks, and each run's answer when its row is not ours:
    --    im_lock_runs (above), shared with im_write_group.
    FOR k IN SELECT l.r_run, l.r_code, l.r_epoch FROM im_lock_runs(p_devices, p_token_sha256s, p_convs, p_users) l LOOP
        run_code[k.r_run] := k.r_code;
        run_lock[k.r_run] := k.r_code IS NULL;
        run_ep[k.r_run] := k.r_epoch;
    END LOOP;
    -- 2. Steps 2-4a read in one statement for every item of the locked runs,
    --    judged below in their order. Within the group an item may repeat
    --    the key of an earlier one (same_key: the latest earlier item with
    --    its key) or name one as its `prev` (prev_at).
    FOR k IN
        WITH rs AS (
            SELECT r.g::integer AS g, r.conv, r.usr,
                   min(r.g) OVER (PARTITION BY r.conv)::integer AS conv_at,
                   min(r.g) OVER (PARTITION BY r.conv, r.usr)::integer AS own_at,
                   EXISTS (SELECT 1 FROM membership_periods m
                            WHERE m.conv_id = r.conv AND m.user_id = r.usr AND m.to_seq IS NULL) AS open,
                   -- moderation (schema/015): a mute in force, once per run
                   EXISTS (SELECT 1 FROM conversation_mutes mu
                            WHERE mu.conv_id = r.conv AND mu.user_id = r.usr
                              AND (mu.until IS NULL OR mu.until > v_now)) AS muted
              FROM unnest(p_convs, p_users) WITH ORDINALITY AS r(conv, usr, g)
             WHERE run_lock[r.g]),
        it AS (
            SELECT u.i::integer AS i, rs.g, rs.conv, rs.usr, rs.conv_at, rs.own_at, rs.open, rs.muted, u.cmid, u.prev,
                   u.reply_to, u.atts,
                   -- The fingerprint (contract section 12): a send without
                   -- reply_to and attachments hashes as before v3, so
                   -- stored keys keep their meaning; else every field that
                   -- makes the content, an absent one's part empty.
                   CASE WHEN u.reply_to IS NULL
                             AND u.atts IS NULL
                        THEN sha256(convert_to(rs.conv, 'UTF8') || '\x00'::bytea || convert_to(u.body, 'UTF8'))
                        ELSE sha256(convert_to(rs.conv, 'UTF8') || '\x00'::bytea || convert_to(u.body, 'UTF8')
                                    || '\x00'::bytea || convert_to('reply:' || coalesce(u.reply_to::text, ''), 'UTF8')
                                    || '\x00'::bytea || convert_to('att:' || coalesce(u.atts, ''), 'UTF8')) END AS fp
              FROM unnest(p_runs, p_cmids, p_bodies, p_prevs, p_reply_tos, p_atts) WITH ORDINALITY
                   AS u(g, cmid, body, prev, reply_to, atts, i)
              JOIN rs ON rs.g = u.g)
        SELECT it.i, it.conv_at, it.own_at, it.open, it.muted, it.fp,
               -- reply_to: a msg of this conversation, not purged (purged
               -- rows are gone), that the sender may read (a period holds it)
               (it.reply_to IS NULL
                OR EXISTS (SELECT 1 FROM events e
                            WHERE e.conv_id = it.conv AND e.seq = it.reply_to AND e.kind = 'msg'
                              AND EXISTS (SELECT 1 FROM membership_periods m
                                           WHERE m.conv_id = it.conv AND m.user_id = it.usr
                                             AND m.from_seq <= it.reply_to
                                             AND (m.to_seq IS NULL OR m.to_seq >= it.reply_to))))
                  AS reply_ok,
               -- attachments: each a complete upload of the sender's user
               -- (its row cannot go before COMMIT: event_attachments' key
               -- holds it), listed as the event carries them.
               CASE WHEN it.atts IS NOT NULL THEN
                   (SELECT jsonb_agg(jsonb_build_object('att_id', up.att_id::text, 'name', up.name, 'mime', up.mime,
                                                        'size', up.size, 'sha256', encode(up.sha256, 'hex'))
                                     ORDER BY x.ord)
                      FROM unnest(string_to_array(it.atts, ',')) WITH ORDINALITY AS x(id, ord)
                      JOIN uploads up ON up.att_id = x.id::uuid AND up.owner_user = it.usr AND up.complete) END
                  AS att_list,
               cardinality(string_to_array(it.atts, ',')) AS att_want,
               o.seq AS o_seq, o.mid AS o_mid, o.epoch AS o_epoch, o.request_hash AS o_hash, o.ts AS o_ts,
               EXISTS (SELECT 1 FROM idem_tombstones t
                        WHERE t.conv_id = it.conv AND t.sender_user = it.usr AND t.client_msg_id = it.cmid) AS tomb,
               (it.prev IS NULL
                OR EXISTS (SELECT 1 FROM events e
                            WHERE e.conv_id = it.conv AND e.sender_user = it.usr AND e.client_msg_id = it.prev)
                OR EXISTS (SELECT 1 FROM idem_tombstones t
                            WHERE t.conv_id = it.conv AND t.sender_user = it.usr AND t.client_msg_id = it.prev))
                  AS prev_ok,
               lag(it.i) OVER (PARTITION BY it.conv, it.usr, it.cmid ORDER BY it.i) AS same_key,
               (SELECT max(b.i) FROM it b
                 WHERE b.conv = it.conv AND b.usr = it.usr AND b.cmid = it.prev AND b.i < it.i) AS prev_at,
               -- the sender's last msg ordinal, read once per (conversation, sender)
               CASE WHEN it.g = it.own_at AND it.i = min(it.i) OVER (PARTITION BY it.g) THEN
                   coalesce((SELECT p.sender_ordinal FROM events p
                              WHERE p.conv_id = it.conv AND p.sender_user = it.usr AND p.kind = 'msg'
                              ORDER BY p.seq DESC LIMIT 1), 0) END AS own_last
          FROM it
          LEFT JOIN LATERAL (
                -- OFFSET 0 plans the key's lookup on its own: through the
                -- request-key index. Without the fence the plan may serve
                -- ORDER BY seq from the primary key instead, reading the
                -- whole conversation for a key that is not there (every
                -- fresh send): quadratic in a long flush.
                SELECT * FROM (
                    -- The key of a recall is taken too, but its hash never
                    -- matches a send's (C3: another kind of request is other
                    -- content, even where the fingerprints' bytes agree).
                    -- The recall side of this rule: im_recall_key in
                    -- server/src/store_admin.cpp.
                    SELECT e.seq, e.mid::text AS mid, e.epoch,
                           CASE WHEN e.kind = 'msg' THEN e.request_hash END AS request_hash,
                           floor(extract(epoch FROM e.created_at) * 1000)::bigint AS ts
                      FROM events e
                     WHERE e.conv_id = it.conv AND e.sender_user = it.usr AND e.client_msg_id = it.cmid
                    OFFSET 0) found
                 ORDER BY found.seq LIMIT 1) o ON true
         ORDER BY it.i
    LOOP
        IF k.own_last IS NOT NULL THEN
            own_ord[k.own_at] := k.own_last;
        END IF;
        a_fp[k.i] := k.fp;
        a_att[k.i] := k.att_list;
        -- 2. The request key: same fingerprint -> the original; else a
        --    mismatch. The original is committed, or new in this call.
        IF k.o_seq IS NOT NULL THEN
            IF k.o_hash = k.fp THEN
                a_code[k.i] := 'OK'; a_seq[k.i] := k.o_seq; a_mid[k.i] := k.o_mid; a_ep[k.i] := k.o_epoch;
                a_dup[k.i] := true; a_ts[k.i] := k.o_ts;
            ELSE
                a_code[k.i] := 'IDEMPOTENCY_MISMATCH';
            END IF;
            CONTINUE;
        END IF;
        j := key_new[k.same_key];
        IF j IS NOT NULL THEN
            key_new[k.i] := j;
            IF a_fp[j] = k.fp THEN
                a_code[k.i] := 'OK'; a_src[k.i] := j; a_dup[k.i] := true;
            ELSE
                a_code[k.i] := 'IDEMPOTENCY_MISMATCH';
            END IF;
            CONTINUE;
        END IF;
        -- 3. A tombstone: the original ran, but retention purged it.
        IF k.tomb THEN
            a_code[k.i] := 'ORIGINAL_EXPIRED';
            CONTINUE;
        END IF;
        -- 4. Write access needs an open period.
        IF NOT k.open THEN
            a_code[k.i] := 'NOT_MEMBER';
            CONTINUE;
        END IF;
        -- 4'. A muted member writes nothing (server.md, moderation); a
        --     resend of what they sent before the mute is still its dup.
        IF k.muted THEN
            a_code[k.i] := 'MUTED';
            CONTINUE;
        END IF;
        -- 4a. Pipelined order: the message named by `prev` is committed (or
        --     was, and retention left its tombstone), or new in this call
        --     before this item; else nothing is written.
        IF NOT (k.prev_ok OR key_new[k.prev_at] IS NOT NULL) THEN
            a_code[k.i] := 'PREV_NOT_COMMITTED';
            CONTINUE;
        END IF;
        -- 4b. reply_to names a msg the sender may read, not purged
        --     (contract section 12); else NOT_FOUND, whichever it is.
        IF NOT k.reply_ok THEN
            a_code[k.i] := 'NOT_FOUND';
            CONTINUE;
        END IF;
        -- 4c. Every attachment a complete upload of the sender's user
        --     (contract section 12); else NOT_FOUND, whichever it is.
        IF k.att_want IS NOT NULL AND coalesce(jsonb_array_length(k.att_list), 0) <> k.att_want THEN
            a_code[k.i] := 'NOT_FOUND';
            CONTINUE;
        END IF;
        -- 5. A new event: its place in its conversation, its running counts.
        a_new[k.i] := true;
        key_new[k.i] := k.i;
        a_conv[k.i] := k.conv_at;
        a_off[k.i] := conv_n[k.conv_at];
        conv_n[k.conv_at] := conv_n[k.conv_at] + 1;
        own_ord[k.own_at] := own_ord[k.own_at] + 1;
        a_own[k.i] := own_ord[k.own_at];
        a_mid[k.i] := gen_random_uuid()::text;
        a_code[k.i] := 'OK'; a_dup[k.i] := false; a_ts[k.i] := v_ts;
    END LOOP;
    -- 3. The counters, one UPDATE for all conversations that got events; it
    --    hands out the first new seq (the rows are ours since step 1). The
    --    ANY makes the rows an index probe: the generic plan guesses 333
    --    rows for generate_subscripts and joined them by hashing the whole
    --    conversations table (a sequential scan per statement, 3.3 ms at
    --    10,000 conversations).
    IF 0 < ANY (conv_n) THEN
        FOR k IN
            UPDATE conversations cv SET next_seq = cv.next_seq + a.n, msg_count = cv.msg_count + a.n
              FROM (SELECT x AS at, p_convs[x] AS conv, conv_n[x] AS n
                      FROM generate_subscripts(conv_n, 1) x WHERE conv_n[x] > 0) a
             WHERE cv.conv_id = a.conv AND cv.conv_id = ANY (p_convs)
            RETURNING a.at, cv.next_seq - a.n AS first_seq, cv.msg_count - a.n AS cnt, cv.epoch
        LOOP
            conv_seq[k.at] := k.first_seq;
            conv_cnt[k.at] := k.cnt;
            run_ep[k.at] := k.epoch;
        END LOOP;
        FOR i IN 1..n LOOP
            IF a_new[i] THEN
                a_seq[i] := conv_seq[a_conv[i]] + a_off[i];
                a_ep[i] := run_ep[a_conv[i]];
            ELSIF a_src[i] IS NOT NULL THEN
                a_seq[i] := a_seq[a_src[i]]; a_mid[i] := a_mid[a_src[i]]; a_ep[i] := a_ep[a_src[i]];
                a_ts[i] := a_ts[a_src[i]];
            END IF;
        END LOOP;
        -- 4. The new events, one statement.
        INSERT INTO events (conv_id, seq, mid, kind, sender_user, client_msg_id, request_hash, body, epoch,
                            msg_ordinal, sender_ordinal, created_at, reply_to, attachments)
        SELECT p_convs[u.g], u.seq, u.mid::uuid, 'msg', p_users[u.g], u.cmid, u.fp, u.body, u.ep,
               conv_cnt[u.conv_at] + u.off + 1, u.own, v_now, u.reply_to, u.att
          FROM unnest(p_runs, p_cmids, p_bodies, a_new, a_seq, a_mid, a_fp, a_ep, a_conv, a_off, a_own, p_reply_tos,
                      a_att)
               AS u(g, cmid, body, new, seq, mid, fp, ep, conv_at, off, own, reply_to, att)
         WHERE u.new;
        -- Their references: what a download's visibility and the collector read.
        INSERT INTO event_attachments (conv_id, seq, ord, att_id)
        SELECT p_convs[u.g], u.seq, (x.ord - 1)::smallint, x.id::uuid
          FROM unnest(p_runs, a_new, a_seq, p_atts) AS u(g, new, seq, atts)
         CROSS JOIN LATERAL unnest(string_to_array(u.atts, ',')) WITH ORDINALITY AS x(id, ord)
         WHERE u.new AND u.atts IS NOT NULL;
    END IF;
    -- 5. The notification, in this transaction (p_channel, above): per
    --    conversation its highest and lowest seq answered OK (new or dup).
    IF p_channel <> '' THEN
        PERFORM pg_notify(p_channel, 'e ' || c.conv || ' ' || c.hi || CASE WHEN c.lo < c.hi THEN ' ' || c.lo ELSE '' END)
           FROM (SELECT p_convs[u.g] AS conv, max(u.seq) AS hi, min(u.seq) AS lo
                   FROM unnest(p_runs, a_code, a_seq) AS u(g, code, seq)
                  WHERE coalesce(run_code[u.g], u.code) = 'OK'
                  GROUP BY p_convs[u.g]) c;
    END IF;
    RETURN QUERY
        SELECT u.g, u.i::integer, coalesce(run_code[u.g], u.code), u.seq, u.mid, u.ep, u.dup, u.ts, u.att::text
          FROM unnest(p_runs, a_code, a_seq, a_mid, a_ep, a_dup, a_ts, a_att) WITH ORDINALITY
               AS u(g, code, seq, mid, ep, dup, ts, att, i)
         ORDER BY u.i;
END
$$;
