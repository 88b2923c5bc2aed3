-- 013: presence across gateways (contract section 13; docs/scaling.md,
-- "Presence"). Typing is never stored; presence is, in three small tables
-- that no request of the message path reads or writes.
--
-- Every gateway holds a lease, renewed by its heartbeat (--presence-lease-ms).
-- A gateway writes a row per user it has at least one connection past
-- `welcome` for, on that user's first connection and removes it on the
-- last one's close, in the background (never inside a hello). A gateway
-- whose lease ran out is swept by any other: its rows go, and its users
-- with no row left on a live gateway go offline.
CREATE TABLE presence_gateways (
    gateway_id   text PRIMARY KEY,
    heartbeat_at timestamptz NOT NULL,   -- database clock of the last renewal
    lease_until  timestamptz NOT NULL
);

CREATE TABLE presence_online (
    user_id    text NOT NULL,
    gateway_id text NOT NULL,
    PRIMARY KEY (user_id, gateway_id)
);
CREATE INDEX presence_online_by_gateway ON presence_online (gateway_id);

-- Per user, what `presence` answers: kept up to date under this row's lock
-- by the gateway whose write changed it. `version` orders the bus's
-- presence pushes (later writers publish larger versions).
CREATE TABLE presence_users (
    user_id      text PRIMARY KEY,
    online       boolean NOT NULL DEFAULT false,
    last_seen_ms bigint,                 -- NULL: never connected since 013
    version      bigint NOT NULL DEFAULT 0
);
