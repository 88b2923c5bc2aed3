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
-- queues behind it. The gate is a transaction-level advisory lock on the
-- bigint key im_device_gate_key(device): 0x494D0001 ("IM", 1) in the high
-- 32 bits, to stay clear of an operator's own advisory locks, and the
-- device id's hashtext in the low ones (two devices whose ids hash alike
-- only share a gate: a wait, never a wrong answer).
--
-- im_send takes the gates of a whole group in one PERFORM of
-- pg_advisory_xact_lock_shared(im_device_gate_key(...)), the key function
-- inlined: a statement taking 8 devices' gates ran in 0.046-0.055 ms
-- against 0.046-0.051 ms for the same statement without the locks, and
-- 0.063-0.070 ms through a PL/pgSQL call per device (pgbench, one client;
-- docs/benchmarks.md, "The device gate"). The two functions below return
-- true, so they can stand in a WHERE clause, where they are evaluated
-- before the row lock of the same query is taken (one request, one device).

CREATE OR REPLACE FUNCTION im_device_gate_key(p_device text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (1229783041::bigint << 32) | (hashtext(p_device)::bigint & 4294967295);

CREATE OR REPLACE FUNCTION im_device_gate_shared(p_device text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(im_device_gate_key(p_device));
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION im_device_gate_exclusive(p_device text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(im_device_gate_key(p_device));
    RETURN true;
END
$$;
