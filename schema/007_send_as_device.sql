-- A revoked device writes nothing more (contract section 4): every send runs
-- through im_send_as, which first takes a share lock on the sending
-- device's row, as it was proved at hello (device id and token hash), and
-- only then runs im_send.
--   * A revocation or a new token (an UPDATE of that row, admin CLI) waits
--     for every send transaction of the device already holding the lock:
--     those committed before the revocation, and their answers are true.
--   * A send that comes after the revocation committed finds the row
--     changed (FOR SHARE re-reads the newest version of a row it waited
--     for), gets UNAUTHENTICATED for each item and writes nothing.
-- Share locks do not conflict with each other, so sends of one device on
-- several connections never wait for one another here; a device row is
-- written only by hello (its install), a revocation or a new token.
CREATE FUNCTION im_send_as(p_device text, p_token_sha256 text, p_conv text, p_user text, p_cmids text[],
                           p_bodies text[], p_prevs text[], p_lock boolean)
RETURNS TABLE (r_item integer, r_code text, r_seq bigint, r_mid text, r_epoch bigint, r_dup boolean, r_ts bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM devices d
      WHERE d.device_id = p_device AND d.user_id = p_user
        AND d.token_sha256 = decode(p_token_sha256, 'hex') AND d.revoked_at IS NULL
        FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT i, 'UNAUTHENTICATED'::text, NULL::bigint, NULL::text, NULL::bigint, NULL::boolean,
                            NULL::bigint
                       FROM generate_series(1, coalesce(array_length(p_cmids, 1), 0)) i;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM im_send(p_conv, p_user, p_cmids, p_bodies, p_prevs, p_lock);
END
$$;
