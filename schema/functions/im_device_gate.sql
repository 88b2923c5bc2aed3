-- The device gate: what makes a revocation (or a new token) of a busy device
-- get through, and then nothing of the device commit after it.
--
-- Every request of a device that is judged on the device's row (a send, an
-- ack or read, a recall, a hello of a known install) holds that row FOR
-- SHARE until its COMMIT, so a revocation, an UPDATE of the row, waits for
-- the requests already judged and every later one re-reads the revoked row.
-- But row locks alone let a revocation starve: a FOR SHARE request that
-- finds the row share-locked by others goes ahead without queueing behind
-- the waiting UPDATE, so a device with requests in flight on several
-- connections all the time keeps its row locked forever (seen: a revocation
-- through the backend API timed out after 7 s under one device's sends on
-- four connections, server_hardening_test, Revocation).
--
-- So each of those requests first takes this gate shared, and a revocation
-- or token change takes it exclusive before its UPDATE. PostgreSQL's lock
-- manager queues fairly: a shared request made while an exclusive one waits
-- queues behind it. The gate is a transaction-level advisory lock on
-- (1229783041, hashtext(device)); 1229783041 is 0x494D0001, "IM" and 1,
-- chosen to stay clear of an operator's own advisory locks (two devices
-- whose ids hash alike only share a gate: a wait, never a wrong answer).
-- Both return true, so they can stand in a WHERE clause, where they are
-- evaluated before the row lock of the same query is taken.

CREATE OR REPLACE FUNCTION im_device_gate_shared(p_device text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1229783041, hashtext(p_device));
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION im_device_gate_exclusive(p_device text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1229783041, hashtext(p_device));
    RETURN true;
END
$$;
