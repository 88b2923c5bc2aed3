-- Backend API keys (server.md "Backend API", docs/integration.md). A key is
-- shown once, when `imserver admin apikey add` makes it; only its SHA-256 is
-- kept. `key_id` is the key's public part (the key reads imk_<key_id>_<secret>):
-- the row is found by it and the hashes are compared in constant time.
CREATE TABLE api_keys (
    name       text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._:-]{1,64}$'),
    key_id     text NOT NULL UNIQUE,
    key_sha256 bytea NOT NULL,
    scope      text NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
