-- The conversation gate: what makes the sends of one conversation, from
-- every gateway, take turns on its row in the order they came (contract
-- section 6: late arrivals queue on the row lock).
--
-- The row lock alone does not queue fairly: every send UPDATEs the row, so
-- a send waiting for it waits for one version, and when the holder commits
-- it must still lock the new version, which a newcomer's statement may
-- lock first (seen: a group busy on one gateway kept winning the row
-- against another gateway's waiting send). PostgreSQL's lock manager does
-- queue fairly: a lock released is granted to the first waiter before it
-- even runs, and a request that conflicts with a waiting one queues behind
-- it (or, tried without waiting, fails).
--
-- So a send takes this gate, a transaction-level advisory lock on
-- im_conv_gate_key(conv), exclusive, before the conversation's row:
-- - im_send TRIES it (pg_try_advisory_xact_lock) for each conversation row
--   its locking select got (so only for a run that passed step 0); held or
--   waited for by another transaction, the run comes back LOCKED like a
--   held row, unwritten;
-- - its retry, im_send_queued (im_send_lock), WAITS for it, in order with
--   the other waiters of every gateway, and then for the row.
-- The key: 0x494D0002 ("IM", 2) in the high 32 bits (the device gate is 1),
-- the conversation id's hashtext in the low ones (two conversations whose
-- ids hash alike only share a gate: a wait, never a wrong answer). Other
-- writers of the row (a recall, an operator's command) lock the row only;
-- the row lock still orders them with the sends.

CREATE OR REPLACE FUNCTION im_conv_gate_key(p_conv text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (1229783042::bigint << 32) | (hashtext(p_conv)::bigint & 4294967295);
